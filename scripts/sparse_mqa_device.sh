#!/usr/bin/env bash
# Build, test, sanitize and time the sparse MQA kernels ON the GPU machine, in one short call
# (docs/sparse_mqa_sm90.md): a smaller sibling of scripts/device_test.sh that builds only
# attention_cuda_test, fp8_cuda_test, engine_graph_test, dcp_bench and (stage worker)
# worker_multirank_test.
#   1. unpacks the carried .debs into a prefix (as device_test.sh), configures for sm_90a and
#      builds the targets with ninja;
#   2. runs the sparse MQA, top-k -> slots and merge tests with DCP_REQUIRE_GPU=1, the fp8_ds_mla
#      tests (fp8_cuda_test: cache write, gather, sparse MQA on fp8 rows) and the engine's
#      graph-capture test (the kernels are captured as programmatic dependents);
#   3. dcp_bench --mode kernels: ceilings, the sparse MQA shapes (both kernels, splits), and the
#      attention kernels of the decode batches at 128 heads, then the fp8_ds_mla rows against
#      the bf16 rows of the same shapes (speed-up and TF/s ratios); stage nopdl repeats the
#      sparse shapes with DCP_NO_PDL=1 (plain launches) for comparison; stage ncu times the
#      one-token decode's attention kernel and split merge apart (Nsight Compute), stage
#      ncu_engine every kernel of a one-token decode layer;
#   4. dcp_bench --mode engine: one DcpEngine layer (host, eager, graph) for the decode batches
#      at 128 heads, with and (stage nopdl) without programmatic launches, and with late
#      triggers (DCP_NO_EARLY_TRIGGER=1);
#   5. the worker's multi-rank suite on CUDA ranks at np 1 and 2 (stage worker, off by default);
#   6. compute-sanitizer memcheck and racecheck on the small sparse MQA (bf16 and fp8 rows) and
#      merge cases;
#   7. stage nogather (extra): a measurement build (-DDCP_SPARSE_MQA_NO_GATHER) whose producer
#      zero-fills the rows rather than reading them: the consumers' ceiling on the same rows;
#   8. stage trace (extra): a profiling build of dcp_bench with -DDCP_SPARSE_MQA_TRACE (its own
#      build folder) prints the wgmma kernel's phase timeline (attention/cuda/
#      sparse_mqa_sm90_trace.cuh) for the rows of DCP_TRACE_ROWS;
#   9. stage ab (extra): a second dcp_bench built with the CUDA defines of DCP_AB_FLAGS (default
#      -DDCP_SPARSE_MQA_L2_HINTS=14: the kernel with the L2 eviction hints that build; the bits
#      are in attention/cuda/sparse_mqa_sm90_gather.cuh), started beside
#      the main build, and the kernels rows of DCP_BENCH_ARGS timed A B A B (A = this tree as
#      built, B = the measurement build), one process each.
# Every stage has a time cap (a hung kernel must not eat the call). Logs go to $OUT.
# Environment: DCP_DEBS (the .debs folder, default .debs), DCP_STAGES (default
# "build test bench variants engine nopdl sanitize"; ncu, ncu_sections, ncu_gemm, ncu_engine, worker,
# nogather, trace, ab and abtest (ab's build tested too) are extra), DCP_VARIANTS (stage variants: ';'-separated environments to bench under,
# default the wgmma kernel's persistent CTAs), DCP_TEST_FILTER, DCP_TEST_TIMEOUT (seconds, default 180),
# DCP_BENCH_ARGS (appended), DCP_BENCH_ONLY (the kernels runs' --only: ','-separated row-name
# prefixes, which may hold spaces), DCP_AB_FLAGS (stage ab), DCP_DECODE_BATCHES (default q1kv4k,64q1kv4k), DCP_TRACE_ROWS (kernel
# rows of stage trace, ';'-separated).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-/tmp/dcp-device-out}"
mkdir -p "$out"
stages="${DCP_STAGES:-build test bench variants engine nopdl sanitize}"
batches="${DCP_DECODE_BATCHES:-q1kv4k,64q1kv4k}"
has_stage() { [[ " $stages " == *" $1 "* ]]; }
debs="${DCP_DEBS:-.debs}"
build="${DCP_BUILD_DIR:-/tmp/build-sparse-mqa}"
prefix=/tmp/dcp-prefix
summary="$out/summary.txt"
: >"$summary"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
note() { echo "$*" | tee -a "$summary"; }
failures=0

nvidia-smi --query-gpu=name,clocks.sm,clocks.max.sm --format=csv,noheader 2>&1 | tee -a "$summary"

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
dcp_unpack_debs "$debs" "$prefix" || exit 2

if has_stage build; then
  if ! dcp_configure_gpu . "$build" "$prefix" >"$out/build.log" 2>&1; then
    tail -30 "$out/build.log"
    note "configure: FAILED"
    exit 1
  fi
  if has_stage ab; then  # the measurement build of stage ab, beside the main one
    # shellcheck disable=SC2046  # an empty word when the abtest stage is off
    (dcp_configure_gpu . "$build-ab" "$prefix" \
        -DCMAKE_CUDA_FLAGS="${DCP_AB_FLAGS:--DDCP_SPARSE_MQA_L2_HINTS=14}" &&
      ninja -C "$build-ab" -j "$(nproc)" dcp_bench \
        $(has_stage abtest && echo attention_cuda_test fp8_cuda_test)) >"$out/ab_build.log" 2>&1 &
    ab_pid=$!
  fi
  # shellcheck disable=SC2046  # an empty word when the worker stage is off
  if ! ninja -C "$build" -j "$(nproc)" attention_cuda_test fp8_cuda_test engine_graph_test dcp_bench \
      $(has_stage worker && echo worker_multirank_test) \
      >>"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -30 | tee -a "$summary"
    note "build: FAILED ($(elapsed))"
    exit 1
  fi
  grep -A2 "SparseMqaSm90Kernel" "$out/build.log" | grep -E "spill|Used" | head -2 | tee -a "$summary"
  note "build: ok ($(elapsed))"
fi
test_exe="$build/tests/attention/cuda/attention_cuda_test"
fp8_exe="$build/tests/workspace/cuda/fp8_cuda_test"

hung=0
if has_stage test; then
  # A small case first, under a short cap: a kernel that hangs stops the call here.
  DCP_REQUIRE_GPU=1 timeout 30 "$test_exe" --gtest_color=no \
      --gtest_filter='SparseMqaCudaTest.SmallSplitsAndCounts' >"$out/test.log" 2>&1
  code=$?
  [ "$code" -eq 124 ] && hung=1
  note "smoke: exit $code ($(elapsed))"
  grep -E "Failure|Expected|Which is|error|FAILED" "$out/test.log" | head -20 | tee -a "$summary"
fi
if has_stage test; then
  # After a hang, the mma.sync kernel's tests alone.
  [ "$hung" -eq 1 ] && export DCP_TEST_MQA_KERNELS=1
  DCP_REQUIRE_GPU=1 timeout "${DCP_TEST_TIMEOUT:-180}" "$test_exe" --gtest_color=no \
      --gtest_filter="${DCP_TEST_FILTER:-SparseMqa*:TopkToSlots*:MergeStates*}" \
      >>"$out/test.log" 2>&1
  code=$?
  [ "$code" -eq 0 ] || failures=$((failures + 1))
  note "test: exit $code ($(elapsed)) $(grep -E '^\[  PASSED|^\[  FAILED' "$out/test.log" | tr '\n' ' ')"
  grep -E "Failure|Expected|Which is|error|FAILED" "$out/test.log" | head -30 | tee -a "$summary"
  # fp8_ds_mla rows: the cache write / gather and sparse MQA (both kernels, bit-exact with the
  # bf16 kernel on the dequantized rows, float64 on the dequantized cache).
  DCP_REQUIRE_GPU=1 timeout 120 "$fp8_exe" --gtest_color=no >"$out/fp8_test.log" 2>&1
  code=$?
  [ "$code" -eq 0 ] || failures=$((failures + 1))
  note "fp8_cuda_test: exit $code ($(elapsed)) $(grep -E '^\[  PASSED|^\[  FAILED' "$out/fp8_test.log" | tr '\n' ' ')"
  grep -E "Failure|Expected|Which is|error|FAILED" "$out/fp8_test.log" | head -20 | tee -a "$summary"
  DCP_REQUIRE_GPU=1 timeout 60 "$build/tests/runtime/cuda/engine_graph_test" --gtest_color=no \
      >>"$out/test.log" 2>&1
  code=$?
  [ "$code" -eq 0 ] || failures=$((failures + 1))
  note "engine_graph_test: exit $code ($(elapsed))"
fi

bench="$build/launch/bench/dcp_bench"
run_kernels() {  # $1: csv name; the rest: environment for the run
  local name=$1
  shift
  # shellcheck disable=SC2086
  env "$@" timeout 100 mpirun --allow-run-as-root --bind-to none -np 1 "$bench" --mode kernels \
      --device cuda --model deepseek_v32 --heads 128 --batches "$batches" -w 3 -n 20 -b 1M -e 1M \
      --csv "/tmp/$name.csv" ${DCP_BENCH_ONLY:+--only "$DCP_BENCH_ONLY"} ${DCP_BENCH_ARGS:-} \
      >"$out/$name.txt" 2>&1
  note "$name: exit $? ($(elapsed))"
  grep -E "copy_ceiling|gemm_ceiling|sparse_mqa|mqa|merge" "$out/$name.txt" | cut -c1-160 | tee -a "$summary"
  fp8_ratios "/tmp/$name.csv" | tee -a "$summary"
}
# fp8_ds_mla rows against bf16 rows, same kernel and selection, from a kernels CSV: each
# "sparse_mqa_sm90_fp8 <shape>" row against "sparse_mqa_sm90 <shape>" (speed-up = bf16 time /
# fp8 time; TF/s ratio = fp8 / bf16), and the batch rows sparse_mqa_fp8 against sparse_mqa.
fp8_ratios() {
  [ -f "$1" ] || return 0
  awk -F, 'NR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; next }
    { k = $col["kernel"]  # shape rows name their shape; batch rows add batch and heads
      if (k !~ /^sparse_mqa_sm/ && col["batch"]) k = k "|" $col["batch"] "|" $col["heads"]
      t[k] = $col["time_us"]; f[k] = $col["tflops"]; order[n++] = k }
    END { for (i = 0; i < n; ++i) { k = order[i]; b = k
            if (sub(/^sparse_mqa_sm90_fp8 /, "sparse_mqa_sm90 ", b) == 0 &&
                sub(/^sparse_mqa_fp8\|/, "sparse_mqa|", b) == 0) continue
            if (!(b in t) || t[k] <= 0) continue
            printf "fp8 vs bf16: %-44s bf16 %9.1f us  fp8 %9.1f us  speed-up %.2fx  TF/s %.1f vs %.1f (%+.0f%%)\n",
                   k, t[b], t[k], t[b] / t[k], f[b], f[k], (f[b] > 0 ? (f[k] / f[b] - 1) * 100 : 0) } }' \
      "$1"
}
run_engine() {
  local name=$1
  shift
  env "$@" timeout 90 mpirun --allow-run-as-root --bind-to none -np 1 "$bench" --mode engine \
      --device cuda --comm nccl --model deepseek_v32 --heads 128 --index_topk 2048 -w 5 -n 50 \
      --batches "$batches" --csv "/tmp/$name.csv" >"$out/$name.txt" 2>&1
  note "$name: exit $? ($(elapsed))"
  grep -E "^ +[0-9a-z]+ " "$out/$name.txt" | head -12 | tee -a "$summary"
}
if has_stage bench && [ "$hung" -eq 0 ]; then run_kernels kernels DCP_BENCH_RUN=1; fi
# Stage variants: the kernels rows again under each ';'-separated environment of DCP_VARIANTS
# (e.g. "DCP_SPARSE_MQA_PREFETCH_PAIRS=0;DCP_SPARSE_MQA_PREFETCH_PAIRS=2"), to compare knobs
# in one call; the rows of the default run above are the baseline.
if has_stage variants && [ "$hung" -eq 0 ]; then
  IFS=';' read -r -a variants <<<"${DCP_VARIANTS:-DCP_SPARSE_MQA_PERSISTENT=1}"
  for i in "${!variants[@]}"; do
    note "variant $i: ${variants[$i]}"
    # shellcheck disable=SC2086  # one environment assignment per word
    run_kernels "kernels_variant$i" DCP_BENCH_RUN=1 ${variants[$i]}
  done
fi
if has_stage engine && [ "$hung" -eq 0 ]; then run_engine engine DCP_BENCH_RUN=1; fi
if has_stage worker && [ "$hung" -eq 0 ]; then
  # The worker's multi-rank equivalence suite on CUDA ranks (compacted slots, split-KV).
  for np in 1 2; do
    DCP_TEST_DEVICE=cuda timeout 150 mpirun --allow-run-as-root --oversubscribe --bind-to none \
        -np "$np" "$build/tests/multirank/worker_multirank_test" --gtest_color=no \
        >"$out/one.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "worker np $np: exit $code ($(elapsed)) $(grep -E '^\[  FAILED' "$out/one.log" | head -3 | tr '\n' ' ')"
    { echo "=== np $np (exit $code)"; cat "$out/one.log"; } >>"$out/worker.log"
    rm -f "$out/one.log"
  done
fi

if has_stage sanitize && [ "$hung" -eq 0 ]; then
  sanitize() {  # $1: tool, $2: test binary, $3: gtest filter, $4: cap in seconds
    DCP_REQUIRE_GPU=1 timeout "$4" compute-sanitizer --tool "$1" --error-exitcode 9 \
        "$2" --gtest_filter="$3" >"$out/one.log" 2>&1
    local code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "$1 $(basename "$2") ${3:0:40}: exit $code ($(elapsed)) $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/one.log" | tail -1)"
    { echo "=== $1 $2 $3 (exit $code)"; cat "$out/one.log"; } >>"$out/sanitize.log"
    rm -f "$out/one.log"
  }
  small='SparseMqaCudaTest.SmallSplits*:SparseMqaCudaTest.OneKey*:SparseMqaCudaTest.NoWorkspace*:TopkToSlotsCudaTest.*:MergeStatesCudaTest.MergeSplits*'
  small_fp8='SparseMqaFp8CudaTest.PartialHeadBlockAndRaggedBlocks:SparseMqaFp8CudaTest.OneKeyAndEmptyCache:SparseMqaFp8CudaTest.ExtremeTileScales*'
  for tool in memcheck racecheck; do
    sanitize "$tool" "$test_exe" "$small" 60
    sanitize "$tool" "$fp8_exe" "$small_fp8" 60
  done
  # The narrow head blocks (16 and 32 heads a CTA) under memcheck: 128 heads, decode tokens.
  sanitize memcheck "$test_exe" 'SparseMqaCudaTest.NarrowHeadBlocksOfDecodeTokens' 90
  # CTAs walking several work items (SparseMqaParams::sm90_ctas), both row formats: the whole
  # bf16 test under memcheck, its small cases under racecheck (the whole test, both consumer
  # schedules, ran past 150 s there, and the roles schedule alone past 100 s).
  sanitize memcheck "$test_exe" 'SparseMqaCudaTest.PersistentCtas*' 150
  sanitize racecheck "$test_exe" 'SparseMqaCudaTest.PersistentCtasSmallCases' 150
  for tool in memcheck racecheck; do
    sanitize "$tool" "$fp8_exe" 'SparseMqaFp8CudaTest.PersistentCtas*' 90
  done
fi

# A measurement build of dcp_bench in its own folder $1, with the CUDA define $2 (stages trace
# and nogather); log $out/$3.
measurement_build() {
  dcp_configure_gpu . "$1" "$prefix" -DCMAKE_CUDA_FLAGS="$2" >"$out/$3" 2>&1 &&
      ninja -C "$1" -j "$(nproc)" dcp_bench >>"$out/$3" 2>&1
}

# The wgmma kernel's phase timeline (a profiling build, its own build folder).
if has_stage trace && [ "$hung" -eq 0 ]; then
  trace_build="$build-trace"
  if measurement_build "$trace_build" -DDCP_SPARSE_MQA_TRACE trace_build.log; then
    note "trace build: ok ($(elapsed))"
    IFS=';' read -r -a trace_rows <<<"${DCP_TRACE_ROWS:-sparse_mqa_sm90 t1 h128 k2048 s16;sparse_mqa_sm90 t64 h128 k2048 s1;sparse_mqa_sm90 t1024 h128 k2048;sparse_mqa_sm90_fp8 t1 h128 k2048 s16}"
    for row in "${trace_rows[@]}"; do
      timeout 60 mpirun --allow-run-as-root --bind-to none -np 1 \
          "$trace_build/launch/bench/dcp_bench" --mode kernels --device cuda --model deepseek_v32 \
          --heads 128 --batches q1kv4k -w 3 -n 5 -b 1M -e 1M --only "$row" >"$out/trace.tmp" 2>&1
      note "trace '$row': exit $?"
      grep -A80 "sparse mqa trace" "$out/trace.tmp" | tee -a "$summary"
    done
  else
    tail -20 "$out/trace_build.log" | tee -a "$summary"
    note "trace build: FAILED ($(elapsed))"
  fi
fi

# The consumers' own ceiling: a measurement build (-DDCP_SPARSE_MQA_NO_GATHER, its own build
# folder) whose bf16 producer zero-fills the rows instead of reading the cache (results wrong,
# no L2 prefetch), timed on the kernels rows of DCP_BENCH_ARGS beside the default build's.
if has_stage nogather && [ "$hung" -eq 0 ]; then
  nogather_build="$build-nogather"
  if measurement_build "$nogather_build" -DDCP_SPARSE_MQA_NO_GATHER nogather_build.log; then
    note "nogather build: ok ($(elapsed))"
    # shellcheck disable=SC2086
    DCP_SPARSE_MQA_PREFETCH_PAIRS=0 timeout 100 mpirun --allow-run-as-root --bind-to none -np 1 \
        "$nogather_build/launch/bench/dcp_bench" --mode kernels --device cuda \
        --model deepseek_v32 --heads 128 --batches "$batches" -w 3 -n 20 -b 1M -e 1M \
        ${DCP_BENCH_ARGS:-} >"$out/nogather.txt" 2>&1
    note "nogather: exit $? ($(elapsed))"
    grep -E "copy_ceiling|gemm_ceiling|sparse_mqa" "$out/nogather.txt" | cut -c1-160 | tee -a "$summary"
  else
    tail -20 "$out/nogather_build.log" | tee -a "$summary"
    note "nogather build: FAILED ($(elapsed))"
  fi
fi

# This tree against a measurement build with other CUDA defines (stage ab): the kernels rows of
# DCP_BENCH_ARGS, A B A B in separate processes (machines and processes differ by a few %).
if has_stage ab && [ "$hung" -eq 0 ]; then
  if [ -n "${ab_pid:-}" ] && wait "$ab_pid"; then
    note "ab build (${DCP_AB_FLAGS:--DDCP_SPARSE_MQA_L2_HINTS=14}): ok ($(elapsed))"
    for round in 1 2; do
      for side in a b; do
        exe="$bench"
        [ "$side" = b ] && exe="$build-ab/launch/bench/dcp_bench"
        # shellcheck disable=SC2086
        timeout 100 mpirun --allow-run-as-root --bind-to none -np 1 "$exe" --mode kernels \
            --device cuda --model deepseek_v32 --heads 128 --batches "${batches%%,*}" -w 3 -n 20 \
            -b 1M -e 1M --csv "/tmp/ab_${side}${round}.csv" \
            ${DCP_BENCH_ONLY:+--only "$DCP_BENCH_ONLY"} ${DCP_BENCH_ARGS:-} \
            >"$out/ab_${side}${round}.txt" 2>&1
        note "ab $side$round: exit $? ($(elapsed))"
      done
    done
    # One line per row: A and B times (us) of both rounds and B / A.
    awk -F, 'FNR == 1 { for (i = 1; i <= NF; ++i) col[$i] = i; f = FILENAME; next }
      $col["kernel"] ~ /sparse_mqa/ { k = $col["kernel"]; t[k, f] = $col["time_us"]; seen[k] = 1 }
      END { for (k in seen) {
              a1 = t[k, "/tmp/ab_a1.csv"]; a2 = t[k, "/tmp/ab_a2.csv"]
              b1 = t[k, "/tmp/ab_b1.csv"]; b2 = t[k, "/tmp/ab_b2.csv"]
              if (a1 > 0 && a2 > 0 && b1 > 0 && b2 > 0)
                printf "ab %-44s A %9.1f %9.1f  B %9.1f %9.1f  B/A %.3f\n", k, a1, a2, b1, b2, (b1 + b2) / (a1 + a2) } }' \
        /tmp/ab_a1.csv /tmp/ab_b1.csv /tmp/ab_a2.csv /tmp/ab_b2.csv | sort | tee -a "$summary"
    # Stage abtest: the sparse MQA tests (bf16 and fp8 rows) of the measurement build too.
    if has_stage abtest; then
      DCP_REQUIRE_GPU=1 timeout "${DCP_TEST_TIMEOUT:-180}" \
          "$build-ab/tests/attention/cuda/attention_cuda_test" --gtest_color=no \
          --gtest_filter="${DCP_TEST_FILTER:-SparseMqa*:TopkToSlots*:MergeStates*}" \
          >"$out/ab_test.log" 2>&1
      code=$?
      [ "$code" -eq 0 ] || failures=$((failures + 1))
      DCP_REQUIRE_GPU=1 timeout 120 "$build-ab/tests/workspace/cuda/fp8_cuda_test" \
          --gtest_color=no >>"$out/ab_test.log" 2>&1
      code2=$?
      [ "$code2" -eq 0 ] || failures=$((failures + 1))
      note "ab tests: attention exit $code, fp8 exit $code2 ($(elapsed)) $(grep -E '^\[  PASSED|^\[  FAILED' "$out/ab_test.log" | tr '\n' ' ')"
      grep -E "Failure|Expected|Which is|FAILED" "$out/ab_test.log" | head -20 | tee -a "$summary"
    fi
  else
    tail -20 "$out/ab_build.log" | tee -a "$summary"
    note "ab build: FAILED ($(elapsed))"
  fi
fi

# GPU time of each kernel of the one-token decode (1 x 128 heads x 2048 keys; bf16 and fp8
# rows; heuristic and forced splits): Nsight Compute's gpu__time_duration with the L2 left warm
# as in the bench, so the attention kernel and the split merge are seen apart.
if has_stage ncu && [ "$hung" -eq 0 ]; then
  timeout 120 mpirun --allow-run-as-root --bind-to none -np 1 ncu --clock-control none \
      --cache-control none --metrics gpu__time_duration.sum -k 'regex:SparseMqaSm90|MergeSplits' \
      "$bench" --mode kernels --device cuda --model deepseek_v32 --heads 128 --batches q1kv4k \
      -w 1 -n 2 -b 1M -e 1M \
      --only "sparse_mqa_sm90 t1 h128 k2048,sparse_mqa_sm90_fp8 t1 h128 k2048" \
      >"$out/ncu.txt" 2>&1
  note "ncu: exit $? ($(elapsed))"
  # The mean duration per kernel, row format and grid (a merge is labelled with the grid of
  # the attention kernel before it, i.e. its split count).
  awk '/SparseMqaSm90Kernel|MergeSplitsKernel/ {
         grid = match($0, /\([0-9]+, [0-9]+, [0-9]+\)x/) ? substr($0, RSTART, RLENGTH - 1) : "?"
         if (index($0, "SparseMqaSm90Kernel")) {
           rows = (index($0, "Kernel<576, 512, 1") ? "fp8" : "bf16"); label = "attention " rows " grid" grid; last = grid
         } else { label = "merge " rows " after grid" last }
       }
       /gpu__time_duration.sum/ { s[label] += $(NF); n[label]++ }
       END { for (k in s) printf "ncu %-44s %7.2f us (mean of %d)\n", k, s[k] / n[k], n[k] }' \
      "$out/ncu.txt" | sort | tee -a "$summary"
fi

# What bounds the dense route's up-projection GEMM (stage ncu_gemm, extra): tensor-pipe, L2 and
# DRAM utilisation of every GEMM kernel the kernels rows of DCP_NCU_GEMM_ROWS launch (default
# the up-projection at 16 heads x 1k rows, issue 13's missed shape, and the ceiling GEMM); the
# tuner's candidate timings are among them, the chosen kernel's replays last. Caches are not
# flushed between kernels (as in the bench's replays). Seen on an H100 (2026-12-05, flushed):
# every candidate one wave of 128-132 CTAs at 31-44% SM and 32-44% L2 throughput: latency-bound.
if has_stage ncu_gemm && [ "$hung" -eq 0 ]; then
  timeout 150 mpirun --allow-run-as-root --bind-to none -np 1 ncu --clock-control none \
      --cache-control none -k 'regex:gemm|Gemm|nvjet|xmma|cutlass' --metrics \
      gpu__time_duration.sum,launch__grid_size,sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__throughput.avg.pct_of_peak_sustained_elapsed,lts__t_bytes.sum.per_second,dram__throughput.avg.pct_of_peak_sustained_elapsed,sm__throughput.avg.pct_of_peak_sustained_elapsed \
      "$bench" --mode kernels --device cuda --model deepseek_v32 --heads 16 --batches q1k \
      -w 1 -n 2 -b 1M -e 1M --only "${DCP_NCU_GEMM_ROWS:-gemm_up_kv,gemm_ceiling}" \
      >"$out/ncu_gemm.txt" 2>&1
  note "ncu gemm: exit $? ($(elapsed))"
  # One line per profiled kernel: its name (cut), then its metrics.
  awk '/\([0-9]+, [0-9]+, [0-9]+\)x\(/ { if (line != "") print line; sub(/^ +/, ""); line = substr($0, 1, 60) }
       /gpu__time_duration|launch__grid_size|gmma_cycles|lts__throughput|lts__t_bytes|dram__throughput|sm__throughput/ {
         line = line " " $1 "=" $NF }
       END { if (line != "") print line }' "$out/ncu_gemm.txt" \
      | sed 's/gpu__time_duration.sum/t/; s/launch__grid_size/grid/; s/sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active/gmma%/; s/lts__throughput.avg.pct_of_peak_sustained_elapsed/l2%/; s/lts__t_bytes.sum.per_second/l2B\/s/; s/dram__throughput.avg.pct_of_peak_sustained_elapsed/dram%/; s/sm__throughput.avg.pct_of_peak_sustained_elapsed/sm%/' \
      | tail -40 | tee -a "$summary"
fi

# What bounds the wgmma kernel (stage ncu_sections, extra): Nsight Compute's speed-of-light,
# memory and warp-state sections, then the tensor pipe's and L2's utilisation, for the rows of
# DCP_NCU_ROWS (',' separated; default the 64- and 1024-token rows at 128 heads).
if has_stage ncu_sections && [ "$hung" -eq 0 ]; then
  rows="${DCP_NCU_ROWS:-sparse_mqa_sm90 t64 h128 k2048 s1,sparse_mqa_sm90 t1024 h128 k2048}"
  timeout 150 mpirun --allow-run-as-root --bind-to none -np 1 ncu --clock-control none \
      -k 'regex:SparseMqaSm90Kernel' --launch-skip 1 --launch-count 4 \
      --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats \
      --section ComputeWorkloadAnalysis --section Occupancy "$bench" --mode kernels \
      --device cuda --model deepseek_v32 --heads 128 --batches q1kv4k -w 1 -n 1 -b 1M -e 1M \
      --only "$rows" >"$out/ncu_sections.txt" 2>&1
  note "ncu sections: exit $? ($(elapsed))"
  grep -E "SparseMqaSm90Kernel|Throughput|Busy|Warp Cycles|Stall|stall|Pipe|Active Warps|Executed Ipc" \
      "$out/ncu_sections.txt" | cut -c1-150 | head -80 | tee -a "$summary"
  timeout 120 mpirun --allow-run-as-root --bind-to none -np 1 ncu --clock-control none \
      -k 'regex:SparseMqaSm90Kernel' --launch-skip 1 --launch-count 4 --metrics \
      sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active,lts__t_bytes.sum.per_second,lts__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum.per_second,l1tex__m_xbar2l1tex_read_bytes.sum.per_second \
      "$bench" --mode kernels --device cuda --model deepseek_v32 --heads 128 --batches q1kv4k \
      -w 1 -n 1 -b 1M -e 1M --only "$rows" >"$out/ncu_metrics.txt" 2>&1
  note "ncu metrics: exit $? ($(elapsed))"
  grep -E "SparseMqaSm90Kernel|gmma|lts__|dram__|xbar|ERROR" "$out/ncu_metrics.txt" | cut -c1-150 \
      | head -40 | tee -a "$summary"
fi

# GPU time of every kernel of the one-token decode layer (1 token x 128 heads, top-k 2048,
# DcpEngine::Run eagerly, one rank over NCCL): Nsight Compute's gpu__time_duration per kernel,
# L2 warm as in the bench (CUPTI tracing off: ncu owns the profiler).
if has_stage ncu_engine && [ "$hung" -eq 0 ]; then
  DCP_BENCH_NO_CUPTI=1 timeout 150 mpirun --allow-run-as-root --bind-to none -np 1 ncu \
      --clock-control none --cache-control none --metrics gpu__time_duration.sum \
      --launch-skip 20 --launch-count 80 "$bench" --mode engine --device cuda --comm nccl \
      --model deepseek_v32 --heads 128 --index_topk 2048 -w 2 -n 5 --batches q1kv4k \
      >"$out/ncu_engine.txt" 2>&1
  note "ncu engine: exit $? ($(elapsed))"
  awk '/\([0-9]+, [0-9]+, [0-9]+\)x\([0-9]+, [0-9]+, [0-9]+\)/ {
         name = $0; sub(/^ +/, "", name); sub(/^void /, "", name); sub(/[(<].*/, "", name)
         sub(/.*::/, "", name) }
       /gpu__time_duration.sum/ { s[name] += $(NF); n[name]++ }
       END { for (k in s) printf "ncu engine %-36s %7.2f us (mean of %d)\n", k, s[k] / n[k], n[k] }' \
      "$out/ncu_engine.txt" | sort | tee -a "$summary"
fi

# Last (the least needed when time is short): the same kernels and layer with plain launches.
if has_stage nopdl && [ "$hung" -eq 0 ]; then
  has_stage bench && batches="${batches%%,*}" run_kernels kernels_nopdl DCP_NO_PDL=1
  has_stage engine && run_engine engine_nopdl DCP_NO_PDL=1
  # Programmatic launches, but the split merge and the top-k -> slots step trigger their
  # dependents when they end, not when they start.
  has_stage engine && run_engine engine_late_trigger DCP_NO_EARLY_TRIGGER=1
fi

note "failures: $failures ($(elapsed))"
exit $(( failures > 0 ? 1 : 0 ))
