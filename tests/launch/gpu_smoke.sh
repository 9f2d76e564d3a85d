#!/usr/bin/env bash
# dcp_run on the GPU machine (see scripts/device_test.sh for the whole suite): unpacks the
# carried .debs, builds dcp_run and make_problem with CUDA, then runs small checked jobs on
# CUDA ranks at the DeepSeek-V3.2 head dims (the sizes the CUDA kernels are compiled for):
# NCCL (world of one), host-staged MPI (ranks sharing the GPU), both routes, and problem files
# (bf16 and fp8_ds_mla caches) verified against make_problem's float64 reference.
# Usage (repository root, GPU machine): bash tests/launch/gpu_smoke.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
prefix=/tmp/dcp-prefix
build="build-gpu"
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
if [ -d "$prefix/usr" ]; then
  dcp_use_prefix "$prefix"
else
  dcp_unpack_debs .debs "$prefix" || exit 2
fi
if [ ! -f "$build/build.ninja" ]; then
  rm -rf "$build"
  dcp_configure_gpu . "$build" "$prefix" -DDCP_BUILD_TESTS=ON -DDCP_BUILD_BENCH=OFF \
    >/tmp/configure.log 2>&1 || { tail -30 /tmp/configure.log; exit 1; }
fi
ninja -C "$build" -j "$(nproc)" dcp_run make_problem >/tmp/gpu_smoke_build.log 2>&1 || {
  grep -E "error|FAILED" /tmp/gpu_smoke_build.log | head -30
  echo "gpu_smoke: the build failed"
  exit 1
}

status=0
step() {
  echo "=== $*"
  timeout 300 "$@" 2>&1 | grep -vE "^\s*$|^-----|Primary job|non-zero exit|mpirun detected|Process name|Exit code:|^\s+collectives per rank" | tail -25
  local code=${PIPESTATUS[0]}
  echo "=== exit $code"
  [ "$code" -eq 0 ] || status=1
}
run="$build/launch/dcp_run"
step mpirun -np 1 "$run" --device cuda --comm nccl --model deepseek_v32 \
  --batch 'q512_4q1kv600,4q1kv3k,4q128kv1k' --check --iters 5 --json
step mpirun -np 2 "$run" --device cuda --comm mpi --model deepseek_v32 \
  --batch 'q256_2q1kv300,2q64kv3k' --combine a2a --interleave 8 --check
mkdir -p /tmp/dcp-problems
"$build/tests/launch/make_problem" all /tmp/dcp-problems
while read -r variant kv; do
  step mpirun -np 2 "$run" --device cuda --comm mpi --problem /tmp/dcp-problems/$variant.safetensors \
    --output /tmp/dcp-problems/$variant.out.safetensors --kv-cache-dtype "$kv" --tolerance 0.05 --check
  step "$build/tests/launch/make_problem" verify /tmp/dcp-problems/$variant.safetensors \
    /tmp/dcp-problems/$variant.out.safetensors 2 - 0.05 "$kv" - bf16  # CUDA ranks store bf16
done <<EOF
deepseek_dense_bf16 bf16
deepseek_sparse_bf16 bf16
deepseek_fp8_dense fp8_ds_mla
deepseek_fp8_sparse fp8_ds_mla
EOF
echo "=== a bad problem file: exit 2 expected"
mpirun -np 2 "$run" --device cuda --comm mpi \
  --problem /tmp/dcp-problems/bad_topk_future.safetensors 2>&1 | grep "dcp_run"
[ "${PIPESTATUS[0]}" -eq 2 ] || status=1
echo "gpu_smoke: $([ $status -eq 0 ] && echo all passed || echo FAILURES)"
exit "$status"
