#!/usr/bin/env bash
# The dense-prefill backends on the GPU machine in one call (docs/dense_prefill_cudnn.md):
# builds only what they need, runs their GPU tests (DCP_REQUIRE_GPU=1: cuDNN must load), then
# dcp_bench kernels (dense_mha native vs cudnn, both models' sizes) and routes (the dense route
# on the issue's shapes), and the torch peers of both. Logs and CSVs go to $OUT.
#   DCP_DENSE_STEPS="tests kernels routes peers" (default all), DCP_DENSE_DEADLINE (s, 330)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
# Everything is written to a work folder and packed into $OUT/dense_prefill.tar.gz at the end
# (the device tool returns few files); the summary is copied beside it.
final="${OUT:-/tmp/dense-prefill-out}"
out=/tmp/dense-prefill-work
rm -rf "$out" && mkdir -p "$out" "$final"
pack() { tar czf "$final/dense_prefill.tar.gz" -C "$out" . ; cp "$out/summary.txt" "$final/"; }
trap pack EXIT
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
deadline="${DCP_DENSE_DEADLINE:-330}"
left() { local l=$(( deadline - ($(date +%s) - started) - ${1:-0} )); (( l < 5 )) && l=5; echo $l; }
steps="${DCP_DENSE_STEPS:-tests kernels routes peers}"
has_step() { [[ " $steps " == *" $1 "* ]]; }
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
prefix=/tmp/dcp-prefix
dcp_unpack_debs .debs "$prefix" || exit 2
dcp_cudnn_from_torch  # the system's libcudnn.so.9 first, torch's as a fallback
note "cuDNN libraries: $(ldconfig -p | grep -o 'libcudnn.so.9 ' | head -1)$(python3 -c 'import nvidia.cudnn, os; print(" python headers", os.path.join(nvidia.cudnn.__path__[0], "include"))' 2>&1 | tail -1)"

build=/tmp/build-dense
echo "== configure + build ($(elapsed))"
dcp_configure_gpu . "$build" "$prefix" >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
grep -E "prefill_backend cudnn" "$out/build.log" | tee -a "$summary"
ninja -C "$build" -k 0 attention_cuda_test worker_multirank_test dcp_bench >>"$out/build.log" 2>&1 \
    || { grep -E "error|FAILED" "$out/build.log" | head -30; note "build: FAILED"; }
note "build done ($(elapsed))"

if has_step tests; then
  echo "== tests ($(elapsed))"
  DCP_REQUIRE_GPU=1 timeout "$(left 200)" "$build/tests/attention/cuda/attention_cuda_test" \
      --gtest_filter='*DensePrefill*:*DenseMha*:*CudnnSdpa*' >"$out/test_attention.log" 2>&1
  note "attention_cuda_test (dense + cudnn): exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_attention.log" | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]' "$out/test_attention.log" | head -20 | tee -a "$summary"
  for np in 1 2; do
    DCP_REQUIRE_GPU=1 DCP_TEST_DEVICE=cuda timeout "$(left 170)" mpirun --allow-run-as-root \
        --oversubscribe --bind-to none -np $np --mca pml ob1 --mca btl self,vader,tcp \
        "$build/tests/multirank/worker_multirank_test" \
        --gtest_filter='*Vllm*:*SeedCases*:*RandomMixed*:*ChunkCount*' >"$out/test_worker_np$np.log" 2>&1
    note "worker cuda np $np: exit $? | $(grep -E '^\[  (PASSED|FAILED) ' "$out/test_worker_np$np.log" | head -2 | tr '\n' ' ')"
  done
fi

bench="$build/launch/bench/dcp_bench"
kernel_batches="q16,q64,q256,q512,q1k,q2k,q8k,2q2k,4q1k,4q2k,8q512,16q64,16q1k,64q512,16q64s128,64q64s128,4q512s2k"
if has_step kernels; then
  echo "== kernels ($(elapsed))"
  for dims in deepseek_v32 glm5; do
    heads=16,128; [ "$dims" = glm5 ] && heads=16,64
    timeout "$(left 110)" "$bench" --mode kernels --device cuda --model $dims --heads $heads \
        --prefill_backend native,cudnn,auto --only dense_mha --batches "$kernel_batches" \
        -w 3 -n 10 --csv "$out/kernels_$dims.csv" >"$out/kernels_$dims.log" 2>&1
    note "kernels $dims: exit $? ($(elapsed))"
  done
fi
if has_step routes; then
  echo "== routes ($(elapsed))"
  for backend in cudnn native; do
    timeout "$(left 60)" "$bench" --mode routes --device cuda --model deepseek_v32 --heads 128 \
        --prefill_backend $backend --batches 2q2k,4q1k,8q512,q1k,4q512s2k -w 2 -n 5 --check 0 \
        --csv "$out/routes_128_$backend.csv" >"$out/routes_128_$backend.log" 2>&1
    timeout "$(left 50)" "$bench" --mode routes --device cuda --model deepseek_v32 --heads 16 \
        --prefill_backend $backend --batches 4q2k,q2k -w 2 -n 5 --check 0 \
        --csv "$out/routes_16_$backend.csv" >"$out/routes_16_$backend.log" 2>&1
    note "routes $backend: exit $? ($(elapsed))"
  done
fi
if has_step peers; then
  echo "== torch peers ($(elapsed))"
  for dims in deepseek_v32 glm5; do
    [ -f "$out/kernels_$dims.csv" ] || continue
    timeout "$(left 25)" python3 scripts/peer_torch.py --kernels "$out/kernels_$dims.csv" \
        --dims $dims -w 2 -n 5 --out "$out/peers_kernels_$dims.csv" >"$out/peers_$dims.log" 2>&1
    note "peers kernels $dims: exit $? ($(elapsed))"
  done
  for f in "$out"/routes_128_cudnn.csv "$out"/routes_16_cudnn.csv; do
    [ -f "$f" ] || continue
    timeout "$(left 5)" python3 scripts/peer_torch.py --routes "$f" -w 2 -n 5 \
        --out "${f%.csv}_peers.csv" >>"$out/peers_routes.log" 2>&1
    note "peers routes $(basename "$f"): exit $? ($(elapsed))"
  done
fi
note "done ($(elapsed))"
