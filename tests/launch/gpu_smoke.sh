#!/usr/bin/env bash
# dcp_run on the GPU machine (see scripts/device_test.sh for the whole suite): unpacks the
# carried .debs, builds dcp_run and make_problem with CUDA, then runs small checked jobs on
# CUDA ranks at the DeepSeek-V3.2 head dims (the sizes the CUDA kernels are compiled for):
# NCCL (world of one), host-staged MPI (ranks sharing the GPU), both routes, and BF16 problem
# files verified against the float64 reference.
# Usage (repository root, GPU machine): bash tests/launch/gpu_smoke.sh
set -uo pipefail
cd "$(dirname "$0")/../.." || exit 1
prefix=/tmp/dcp-prefix
build="build-gpu"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMPI_MCA_rmaps_base_oversubscribe=1
export NCCL_NVLS_ENABLE=0
if [ ! -d "$prefix/usr" ]; then
  mkdir -p "$prefix" && for deb in .debs/*.deb; do dpkg -x "$deb" "$prefix"; done
  if ! find /usr /usr/local -path '*cmake/GTest/GTestConfig.cmake' 2>/dev/null | grep -q .; then
    for deb in .debs/fallback/*.deb; do dpkg -x "$deb" "$prefix"; done
  fi
fi
export LD_LIBRARY_PATH="$prefix/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
if [ ! -f "$build/build.ninja" ]; then
  rm -rf "$build"
  cmake -S . -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$prefix/usr" -DDCP_BUILD_TESTS=ON \
    -DDCP_BUILD_BENCH=OFF -DCMAKE_CXX_FLAGS="-include cstdint" \
    >/tmp/configure.log 2>&1 ||
    { tail -30 /tmp/configure.log; exit 1; }
fi
ninja -C "$build" -j "$(nproc)" dcp_run make_problem 2>&1 | grep -E "error|FAILED" | head -30
[ -x "$build/launch/dcp_run" ] || { echo "gpu_smoke: dcp_run did not build"; exit 1; }

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
for variant in deepseek_dense_bf16 deepseek_sparse_bf16; do
  step mpirun -np 2 "$run" --device cuda --comm mpi --problem /tmp/dcp-problems/$variant.safetensors \
    --output /tmp/dcp-problems/$variant.out.safetensors --tolerance 0.05 --check
  step "$build/tests/launch/make_problem" verify /tmp/dcp-problems/$variant.safetensors \
    /tmp/dcp-problems/$variant.out.safetensors 2 - 0.05
done
echo "=== a bad problem file: exit 2 expected"
mpirun -np 2 "$run" --device cuda --comm mpi \
  --problem /tmp/dcp-problems/bad_topk_future.safetensors 2>&1 | grep "dcp_run"
[ "${PIPESTATUS[0]}" -eq 2 ] || status=1
echo "gpu_smoke: $([ $status -eq 0 ] && echo all passed || echo FAILURES)"
