#!/usr/bin/env bash
# The one command that checks the CUDA ranks ON the GPU machine (docs/NOTES.md, "GPU machine"):
#   1. unpacks the carried .debs (scripts/fetch_debs.sh, run beforehand with network) into a
#      prefix: Abseil, nlohmann-json, yaml-cpp, Google Benchmark; GoogleTest only if missing;
#   2. configures with -DDCP_WITH_CUDA=ON against that prefix and builds with ninja;
#   3. runs the whole ctest suite with DCP_REQUIRE_GPU=1 (a skipped GPU test fails), which
#      includes the multi-rank GPU tests at np 1, 2 and 4 on the one GPU;
#   4. runs compute-sanitizer memcheck on the GPU kernel test binaries (and racecheck on the
#      shared-memory attention kernels, small cases);
#   5. times the kernels against the card's copy and GEMM ceilings (dcp_bench --mode kernels);
#   6. runs dcp_run --device cuda --check at the DeepSeek-V3.2 dims for both routes, and on
#      problem files (bf16 and fp8_ds_mla caches, random ones too) verified by make_problem;
#   7. prints a short summary last.
# Logs go to $OUT (the device tool's output folder) or /tmp/dcp-device-out, at most 7 files
# (summary, build, ctest, sanitizer, bench, dcp_run logs): the tool returns 8 at most.
# Environment: DCP_STAGES (default "build test sanitize bench engine run"), DCP_CTEST_ARGS
# (extra ctest arguments, e.g. "-R cuda"), DCP_JOBS (build jobs, default nproc),
# DCP_BUILD_TARGETS (ninja targets, default all), DCP_ENGINE_BATCHES, DCP_ENGINE_AB (settings
# to run the engine bench under, one run each: "DCP_GEMM_TUNE=0 DCP_GEMM_TUNE=1"), DCP_KERNEL_BATCHES,
# DCP_BENCH_ONLY (the kernel bench's --only: kernel name prefixes).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
out="${OUT:-/tmp/dcp-device-out}"
mkdir -p "$out"
stages="${DCP_STAGES:-build test sanitize bench engine run}"  # also: worker
jobs="${DCP_JOBS:-$(nproc)}"
build="$root/build-gpu"
prefix=/tmp/dcp-prefix
summary="$out/summary.txt"
failures=0  # stages that failed; the exit status is 1 when any did
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
has_stage() { [[ " $stages " == *" $1 "* ]]; }
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env

echo "== machine"
{
  grep PRETTY_NAME /etc/os-release
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv,noheader
  nvcc --version | tail -1
  g++ --version | head -1
  cmake --version | head -1
  mpirun --version 2>&1 | head -1
  ls /usr/include/nccl.h /usr/local/cuda/include/nccl.h 2>/dev/null
} 2>&1

# 1. Unpack the carried packages.
dcp_unpack_debs .debs "$prefix" || exit 2

# 2. Configure and build.
if has_stage build; then
  echo "== configure + build ($(elapsed))"
  rm -rf "$build"  # a cache from an earlier call would keep its old flags
  if ! dcp_configure_gpu . "$build" "$prefix" >"$out/build.log" 2>&1; then
    tail -40 "$out/build.log"
    note "configure: FAILED (see build.log)"
    exit 1
  fi
  # shellcheck disable=SC2086
  if ! ninja -C "$build" -j "$jobs" -k 0 ${DCP_BUILD_TARGETS:-} >>"$out/build.log" 2>&1; then
    grep -E "error|FAILED" "$out/build.log" | head -40
    note "build: FAILED (see build.log); continuing with what built"
    failures=$((failures + 1))
  else
    note "build: ok ($(elapsed))"
  fi
fi

# 3. The whole suite, GPU required.
if has_stage test; then
  echo "== ctest, DCP_REQUIRE_GPU=1 ($(elapsed))"
  # shellcheck disable=SC2086
  # scripts_shellcheck is left to CI: the GPU machines have no shellcheck (and no network).
  DCP_REQUIRE_GPU=1 ctest --test-dir "$build" -j 8 --timeout 300 --output-on-failure \
      -E '^scripts_shellcheck$' ${DCP_CTEST_ARGS:-} >"$out/ctest.log" 2>&1 ||
    failures=$((failures + 1))
  note "ctest: scripts_shellcheck left out (linted in CI)"
  grep -E "tests passed|tests failed" "$out/ctest.log" | tail -1 | sed 's/^/ctest: /' | tee -a "$summary"
  grep -E "^\s+[0-9]+ - .*\((Failed|Timeout|Not Run|SEGFAULT|Subprocess)" "$out/ctest.log" \
      | head -30 | tee -a "$summary"
  grep -cE "Skipped|SKIPPED" "$out/ctest.log" | sed 's/^/ctest lines mentioning skips: /' | tee -a "$summary"
fi

# 4. compute-sanitizer on the GPU kernel tests (the chip-filling cases are left out: memcheck
# slows kernels by orders of magnitude; the small cases cover every code path).
if has_stage sanitize; then
  echo "== compute-sanitizer ($(elapsed))"
  big='*FillsTheChip*:*LargePagedGather*:*DeepSeekShapeAllHeads*:*DecodeBatchWithValidCounts*:*EverySplitCount*'
  for path in attention/cuda/attention_cuda_test workspace/cuda/workspace_cuda_test \
              runtime/cuda/cuda_device_test workspace/cuda/fp8_cuda_test; do
    binary="$(basename "$path")"
    exe="$build/tests/$path"
    [ -x "$exe" ] || { note "memcheck $binary: not built"; continue; }
    # --report-api-errors no: the tests provoke API errors on purpose (a petabyte cudaMalloc)
    # and check the returned codes themselves; memcheck is here for kernel memory accesses.
    DCP_REQUIRE_GPU=1 timeout 240 compute-sanitizer --tool memcheck --error-exitcode 9 \
        --leak-check no --report-api-errors no "$exe" --gtest_filter="-$big" >"$out/one_sanitizer_run.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "memcheck $binary: exit $code, $(grep -E 'ERROR SUMMARY' "$out/one_sanitizer_run.log" | tail -1)"
    { echo "=== memcheck $binary (exit $code)"; cat "$out/one_sanitizer_run.log"; } >>"$out/sanitizer.log"
  done
  exe="$build/tests/attention/cuda/attention_cuda_test"
  if [ -x "$exe" ]; then
    DCP_REQUIRE_GPU=1 timeout 240 compute-sanitizer --tool racecheck --error-exitcode 9 "$exe" \
        --gtest_filter='SparseMqaCudaTest.RaggedTopk*:SparseMqaCudaTest.OneKey*:SparseMqaCudaTest.SmallSplits*:SparseMqaCudaTest.ClusterMergeSmallCases:SparseMqaCudaTest.PersistentCtasSmallCases:TopkToSlotsCudaTest.CompactsLongRows:DenseMhaCudaTest.CausalRagged*:DenseMhaCudaTest.NonCausal*:GemmSmallMTest.*' \
        >"$out/one_sanitizer_run.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "racecheck attention (small cases): exit $code, $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$out/one_sanitizer_run.log" | tail -1)"
    { echo "=== racecheck (exit $code)"; cat "$out/one_sanitizer_run.log"; } >>"$out/sanitizer.log"
  fi
  rm -f "$out/one_sanitizer_run.log"
fi

# 5. Kernel timings.
if has_stage bench; then
  echo "== kernel bench ($(elapsed))"
  if [ -x "$build/launch/bench/dcp_bench" ]; then
    timeout 240 mpirun -np 1 "$build/launch/bench/dcp_bench" --mode kernels --device cuda \
        --model deepseek_v32 --heads 16,128 -w 3 -n 10 --batches "${DCP_KERNEL_BATCHES:-q1kv4k,64q1kv4k,q1k,q4k}" \
        ${DCP_BENCH_ONLY:+--only "$DCP_BENCH_ONLY"} --csv "$out/kernels.csv" >"$out/bench.txt" 2>&1
    note "bench: exit $?"
  else
    note "bench: dcp_bench not built"
  fi
fi

# 5b. The engine layer's latency (dcp_bench --mode engine): decode and small prefill batches at
# the DeepSeek-V3.2 dims, one rank over NCCL: host time in Run, eager and graph-replayed layer.
if has_stage engine; then
  echo "== engine layer bench ($(elapsed))"
  bench="$build/launch/bench/dcp_bench"
  if [ -x "$bench" ]; then
    # DCP_ENGINE_AB: space-separated VAR=value settings, one run each in this call (an A/B of
    # a switch, e.g. "DCP_GEMM_TUNE=0 DCP_GEMM_TUNE=1"); empty: one run as the environment is.
    for setting in ${DCP_ENGINE_AB:-none}; do
      tag=""
      [ "$setting" = none ] || tag="_${setting//[^A-Za-z0-9]/_}"
      # shellcheck disable=SC2046
      env $([ "$setting" = none ] || echo "$setting") \
        timeout 240 mpirun -np 1 "$bench" --mode engine --device cuda --comm nccl \
          --model deepseek_v32 --heads 16,128 --index_topk 2048 -w 3 -n 50 \
          --batches "${DCP_ENGINE_BATCHES:-q1s4k,64q1s4k,q1s16k,4q512}" \
          --csv "$out/engine$tag.csv" >"$out/engine$tag.txt" 2>&1
      note "engine bench${tag:+ ($setting)}: exit $?"
      grep -E "^ +[0-9a-z]+ " "$out/engine$tag.txt" | head -20 | tee -a "$summary"
    done
  else
    note "engine bench: dcp_bench not built"
  fi
fi

# 6. dcp_run --device cuda --check at the DeepSeek-V3.2 dims (H 128, R 512, Dn 128, Dr 64,
# Dv 128, K 2048): '4q1kv4k_q512' takes both routes in one batch (the 512-token prefill is
# within K: dense MHA; the decodes over 4096 tokens: sparse MQA with top-2048). The check's
# reference runs on rank 0's CPU, so the batch stays small. np 1 uses NCCL (a world of one);
# np > 1 shares the one GPU: --comm nccl must fail clearly, --comm mpi (host staging) must run.
if has_stage run; then
  echo "== dcp_run --device cuda --check ($(elapsed))"
  run="$build/launch/dcp_run"
  if [ -x "$run" ]; then
    batch="${DCP_RUN_BATCH:-4q1kv4k_q512}"
    while read -r np comm combine; do
      [ -n "$np" ] || continue
      log="$out/one_dcp_run.log"
      timeout 150 mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
          </dev/null "$run" --device cuda --comm "$comm" --combine "$combine" --model deepseek_v32 \
          --num_heads 128 --index_topk 2048 --batch "$batch" --check >"$log" 2>&1
      code=$?
      # NCCL on ranks that share a GPU must be refused clearly (exit 2, bad input); anything
      # else must pass its check.
      if [ "$comm" = nccl ] && [ "$np" -gt "$(nvidia-smi -L | wc -l)" ]; then
        { [ "$code" -eq 2 ] && grep -q "needs one GPU per rank" "$log"; } ||
          failures=$((failures + 1))
      elif [ "$code" -ne 0 ]; then
        failures=$((failures + 1))
      fi
      note "dcp_run np $np --comm $comm --combine $combine: exit $code | $(grep -iE 'check|error|relative|route' "$log" | tail -4 | tr '\n' ' ' | cut -c1-500)"
      { echo "=== np $np --comm $comm --combine $combine (exit $code)"; cat "$log"; } >>"$out/dcp_run.log"
      rm -f "$log"
    done <<EOF_RUNS
${DCP_RUNS:-1 nccl ag_rs
1 nccl a2a
2 nccl ag_rs
2 mpi ag_rs
2 mpi a2a
4 mpi ag_rs
4 mpi a2a}
EOF_RUNS
    # Problem files on CUDA ranks (np 2, host-staged MPI) against make_problem's float64
    # reference, tolerance 0.05 (bf16 K/V and q'): the DeepSeek-dim bf16 problems, the
    # fp8_ds_mla ones (the reference quantizes the values as a CUDA rank stores them, rounded
    # to bf16: verify's last argument; from the float32 values it is 0.04 off on its own),
    # then random fp8_ds_mla problems (tests/launch/random_problems.cmake).
    make_problem="$build/tests/launch/make_problem"
    dir=/tmp/dcp-problems
    mkdir -p "$dir"
    if [ -x "$make_problem" ] && "$make_problem" all "$dir"; then
      while read -r variant kv; do
        log="$out/one_dcp_run.log"
        problem="$dir/$variant.safetensors"
        result="$dir/$variant.cuda.safetensors"
        timeout 150 mpirun --allow-run-as-root --oversubscribe --bind-to none -np 2 </dev/null \
            "$run" --device cuda --comm mpi --problem "$problem" --output "$result" \
            --kv-cache-dtype "$kv" >"$log" 2>&1 &&
          "$make_problem" verify "$problem" "$result" 2 - 0.05 "$kv" - bf16 >>"$log" 2>&1
        code=$?
        [ "$code" -eq 0 ] || failures=$((failures + 1))
        note "problem $variant ($kv) np 2: exit $code | $(grep -E '^verify' "$log" | cut -c1-300)"
        { echo "=== problem $variant $kv (exit $code)"; cat "$log"; } >>"$out/dcp_run.log"
        rm -f "$log"
      done <<EOF_PROBLEMS
deepseek_dense_bf16 bf16
deepseek_sparse_bf16 bf16
deepseek_fp8_dense fp8_ds_mla
deepseek_fp8_sparse fp8_ds_mla
EOF_PROBLEMS
      cmake -DMAKE_PROBLEM="$make_problem" -DDCP_RUN="$run" -DFOLDER="$dir" -DFIRST=1 -DLAST=8 \
        -DLAUNCH="mpirun@@--allow-run-as-root@@--oversubscribe@@--bind-to@@none" -DFP8=1 \
        -DEXTRA="--device@@cuda@@--comm@@mpi" -DTOLERANCE=0.05 -DSTORED=bf16 -DANY_ROUTES=1 \
        -P tests/launch/random_problems.cmake >>"$out/dcp_run.log" 2>&1
      code=$?
      [ "$code" -eq 0 ] || failures=$((failures + 1))
      note "random fp8_ds_mla problems 1-8 on CUDA ranks: exit $code"
    else
      note "problem files: make_problem not built or failed"
      failures=$((failures + 1))
    fi
  else
    note "dcp_run: not built"
  fi
fi

# 7. The worker's multi-rank equivalence suite on CUDA ranks, repeated (fresh random batches each
# time), with new device buffers poisoned (NaN) so that reads of unwritten memory show.
if has_stage worker; then
  echo "== worker on CUDA ranks, repeated ($(elapsed))"
  exe="$build/tests/multirank/worker_multirank_test"
  if [ -x "$exe" ]; then
    for np in ${DCP_WORKER_NPS:-1 2 4}; do
      for poison in 0 1; do
        for rep in $(seq "${DCP_WORKER_REPS:-2}"); do
          log="$out/one_worker_run.log"
          DCP_REQUIRE_GPU=1 DCP_TEST_DEVICE=cuda DCP_CUDA_POISON_ALLOCATIONS=$poison timeout 120 mpirun \
              --allow-run-as-root --oversubscribe --bind-to none -np "$np" </dev/null "$exe" \
              --gtest_color=no ${DCP_WORKER_FILTER:+--gtest_filter=$DCP_WORKER_FILTER} >"$log" 2>&1
          code=$?
          [ "$code" -eq 0 ] || failures=$((failures + 1))
          note "worker np $np poison $poison rep $rep: exit $code $(grep -E '^\[  FAILED  \]|exceeds|evaluates to|out token|lse token|I [0-9]+ combine|seed|NaN|nan' "$log" | head -8 | tr '\n' ' ' | cut -c1-700)"
          { echo "=== worker np $np poison $poison rep $rep (exit $code)"; cat "$log"; } >>"$out/worker.log"
          rm -f "$log"
        done
      done
    done
  else
    note "worker: worker_multirank_test not built"
  fi
fi

echo
echo "================ summary ($(elapsed)) ================"
cat "$summary"
if [ -f "$out/bench.txt" ]; then tail -12 "$out/bench.txt"; fi
echo "failures: $failures"
exit $(( failures > 0 ? 1 : 0 ))
