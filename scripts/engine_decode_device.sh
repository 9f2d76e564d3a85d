#!/usr/bin/env bash
# The decode latency of the engine layer on the GPU machine in one call
# (docs/engine_decode_latency.md): builds only what it needs, runs the GEMM, engine-graph and
# CUDA-device tests (DCP_REQUIRE_GPU=1) and the worker suite on one CUDA rank, compute-sanitizer on the
# small-M GEMM tests, then dcp_bench: the small-M GEMM against cuBLAS (--mode kernels --only
# gemm_) and the engine layer (--mode engine) with the small-M kernel and without it
# (DCP_NO_SMALL_M_GEMM=1, same binary); step timeline prints the kernels of one replayed layer
# as they ran (DCP_BENCH_TIMELINE=1) under each environment of DCP_TIMELINE_ENVS (';'-separated
# lists of VAR=VALUE, empty for the defaults). The engine step also runs the plan's uploads one
# copy each (DCP_BATCH_UPLOADS=0; batched is the default) between two default runs: compare the
# plan us column.
# Logs and CSVs go to $OUT (8 files: the tool's limit).
#   DCP_DECODE_STEPS="tests sanitize kernels engine" (default; timeline on request),
#   DCP_DEBS_DIR (default .debs),
#   DCP_CUDNN_FRONTEND_INCLUDE_DIR (passed to CMake when set), DCP_WORKER_FILTER and
#   DCP_ATTENTION_FILTER (gtest filters of the worker suite and of attention_cuda_test)
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-/tmp/engine-decode-out}"
mkdir -p "$out"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
steps="${DCP_DECODE_STEPS:-tests sanitize kernels engine}"
has_step() { [[ " $steps " == *" $1 "* ]]; }
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failures=0

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
prefix=/tmp/dcp-prefix
# scripts/fetch_debs.sh's packages (another checkout's, if given)
dcp_unpack_debs "${DCP_DEBS_DIR:-.debs}" "$prefix" || exit 2

build=/tmp/build-engine-decode
echo "== configure + build ($(elapsed))"
dcp_configure_gpu . "$build" "$prefix" \
    ${DCP_CUDNN_FRONTEND_INCLUDE_DIR:+-DDCP_CUDNN_FRONTEND_INCLUDE_DIR="$DCP_CUDNN_FRONTEND_INCLUDE_DIR"} \
    >"$out/build.log" 2>&1 || { tail -30 "$out/build.log"; exit 1; }
if ! ninja -C "$build" -k 0 attention_cuda_test engine_graph_test cuda_device_test \
    worker_multirank_test engine_workload_multirank_test dcp_bench >>"$out/build.log" 2>&1; then
  grep -E "error|FAILED" "$out/build.log" | head -30
  note "build: FAILED"
  failures=$((failures + 1))
fi
note "build done ($(elapsed))"

run_test() {  # name, command...
  local name=$1
  shift
  DCP_REQUIRE_GPU=1 timeout 120 "$@" >"$out/one_test.log" 2>&1
  local code=$?
  [ "$code" -eq 0 ] || failures=$((failures + 1))
  note "$name: exit $code | $(grep -E '^\[  (PASSED|FAILED) ' "$out/one_test.log" | head -2 | tr '\n' ' ')"
  grep -E '^\[  FAILED  \]|Failure|error' "$out/one_test.log" | head -12 | tee -a "$summary"
  { echo "=== $name (exit $code)"; cat "$out/one_test.log"; } >>"$out/tests.log"
  rm -f "$out/one_test.log"
}

if has_step tests; then
  echo "== tests ($(elapsed))"
  run_test "attention (${DCP_ATTENTION_FILTER:-Gemm*})" "$build/tests/attention/cuda/attention_cuda_test" \
      --gtest_filter="${DCP_ATTENTION_FILTER:-Gemm*}"
  run_test "engine graph" "$build/tests/runtime/cuda/engine_graph_test"
  run_test "cuda device" "$build/tests/runtime/cuda/cuda_device_test"
  for np in ${DCP_WORKER_NPS:-1}; do
    run_test "worker cuda np $np" env DCP_TEST_DEVICE=cuda mpirun --allow-run-as-root \
        --oversubscribe --bind-to none -np $np --mca pml ob1 --mca btl self,vader,tcp \
        "$build/tests/multirank/worker_multirank_test" ${DCP_WORKER_FILTER:+--gtest_filter="$DCP_WORKER_FILTER"}
  done
  # The plan's uploads one copy each (DCP_BATCH_UPLOADS=0; batched is the default).
  run_test "worker cuda np 1 unbatched uploads" env DCP_BATCH_UPLOADS=0 DCP_TEST_DEVICE=cuda \
      mpirun --allow-run-as-root --oversubscribe --bind-to none -np 1 --mca pml ob1 \
      --mca btl self,vader,tcp "$build/tests/multirank/worker_multirank_test" \
      ${DCP_WORKER_FILTER:+--gtest_filter="$DCP_WORKER_FILTER"}
  # Many steps over one engine (its staging ring wraps, scratch is reused), with and without.
  for batched in 0 1; do
    run_test "engine workload cuda np 1 batched uploads $batched" env DCP_BATCH_UPLOADS=$batched \
        DCP_TEST_DEVICE=cuda DCP_WORKLOAD_COUNT=3 mpirun --allow-run-as-root --oversubscribe \
        --bind-to none -np 1 --mca pml ob1 --mca btl self,vader,tcp \
        "$build/tests/multirank/engine_workload_multirank_test"
  done
fi

if has_step sanitize; then
  echo "== compute-sanitizer ($(elapsed))"
  for tool in memcheck racecheck; do
    DCP_REQUIRE_GPU=1 timeout 150 compute-sanitizer --tool $tool --error-exitcode 9 \
        "$build/tests/attention/cuda/attention_cuda_test" \
        --gtest_filter='GemmSmallM*:-*DecodeProjectionShapes*' >"$out/one_test.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "$tool small-M GEMM: exit $code, $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/one_test.log" | tail -1)"
    { echo "=== $tool (exit $code)"; cat "$out/one_test.log"; } >>"$out/tests.log"
    rm -f "$out/one_test.log"
  done
fi

bench="$build/launch/bench/dcp_bench"
if has_step kernels; then
  echo "== kernels ($(elapsed))"
  timeout 120 mpirun -np 1 "$bench" --mode kernels --device cuda --model deepseek_v32 \
      --heads 128 --only gemm_ --batches q1kv4k -w 5 -n 20 --csv "$out/kernels.csv" \
      >"$out/kernels.txt" 2>&1
  note "kernels: exit $? ($(elapsed))"
fi
if has_step engine; then
  echo "== engine ($(elapsed))"
  for variant in small_m cublas small_m_no_pdl unbatched_uploads small_m_again; do
    extra=()
    [ "$variant" = cublas ] && extra=(env DCP_NO_SMALL_M_GEMM=1)
    [ "$variant" = small_m_no_pdl ] && extra=(env DCP_NO_PDL=1)
    [ "$variant" = unbatched_uploads ] && extra=(env DCP_BATCH_UPLOADS=0)  # the plan us column
    csv=()  # 8 files come back: the other tables are in engine.txt
    [ "$variant" = small_m ] || [ "$variant" = cublas ] && csv=("--csv" "$out/engine_$variant.csv")
    timeout 120 "${extra[@]}" mpirun -np 1 "$bench" --mode engine \
        --device cuda --comm nccl --model deepseek_v32 --heads 16,128 --index_topk 2048 \
        -w 3 -n 50 --batches q1s4k,4q1s4k,16q1s4k,64q1s4k "${csv[@]}" \
        >"$out/one_engine.txt" 2>&1
    note "engine $variant: exit $? ($(elapsed))"
    grep -E "^ +[0-9a-z]+ " "$out/one_engine.txt" | head -12 | tee -a "$summary"
    { echo "=== engine $variant"; cat "$out/one_engine.txt"; } >>"$out/engine.txt"
    rm -f "$out/one_engine.txt"
  done
fi
if has_step timeline; then
  echo "== timeline ($(elapsed))"
  IFS=';' read -r -a envs <<<"${DCP_TIMELINE_ENVS:-}"
  [ "${#envs[@]}" -eq 0 ] && envs=("")
  for assignments in "${envs[@]}"; do
    # shellcheck disable=SC2086
    timeout 120 env DCP_BENCH_TIMELINE=1 $assignments mpirun -np 1 "$bench" --mode engine \
        --device cuda --comm nccl --model deepseek_v32 --heads 16,128 --index_topk 2048 \
        -w 3 -n 50 --batches "${DCP_TIMELINE_BATCHES:-q1s4k,64q1s4k}" >"$out/one_engine.txt" 2>&1
    note "timeline [${assignments:-defaults}]: exit $? ($(elapsed))"
    grep -E "^ +[0-9a-z]+ " "$out/one_engine.txt" | head -6 | tee -a "$summary"
    { echo "=== timeline [${assignments:-defaults}]"; cat "$out/one_engine.txt"; } >>"$out/timeline.txt"
    rm -f "$out/one_engine.txt"
  done
fi
note "failures: $failures ($(elapsed))"
exit $(( failures > 0 ? 1 : 0 ))
