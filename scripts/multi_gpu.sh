#!/usr/bin/env bash
# Everything that needs several GPUs (issue 16), on whatever number of GPUs this machine has, in
# one call of the GPU tool (keep it under its 10-minute limit: DCP_STAGES runs a subset):
#   suite        the whole CTest suite with DCP_REQUIRE_GPU=1, plus the NCCL multi-rank entries
#                (worker, engine workloads, communicator) at np = number of GPUs;
#   deepseek     dcp_run --config launch/configs/deepseek_v32.yaml at np = GPUs (one per GPU,
#                NCCL) with --check, both combines, bf16 and fp8_ds_mla caches, on batches small
#                enough for the check's CPU reference (the config's own take minutes there):
#                DCP_DEEPSEEK_BATCHES, default 2q256_8q1kv4k and 2q128kv512 (dense MHA: fresh
#                prefills with decodes, prefills over cached context through the workspace),
#                8q1kv4k and q64kv3k_4q1kv4k (sparse MQA: decodes, a prefill beyond K with
#                decodes); the same check at np 2 on CPU ranks takes ~10 s;
#   collectives  dcp_bench --mode collectives at W = 2, 4, 8 (those <= GPUs): the workspace fill
#                and both combines against raw NCCL (ratio and busbw columns, nccl-tests' definition);
#   routes       dcp_bench --mode routes and --mode engine at the same W (communication times per
#                route; the decode layer eager and graph-replayed);
#   stall        a rank stopped with SIGSTOP in a W-rank NCCL job: every other rank must exit
#                within the timeout plus 10 s (tests/launch/stalled_rank.sh).
# Prerequisites as for scripts/device_test.sh (.debs and .deps carried); it builds with that
# script's build stage. Logs and CSVs go to $OUT (at most 8 files come back: they are packed
# into one archive). Record the figures with date, commit and machine in docs/PERFORMANCE.md.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-/tmp/dcp-multi-gpu-out}"
mkdir -p "$out"
work=$(mktemp -d)
stages="${DCP_STAGES:-suite deepseek collectives routes stall}"
has_stage() { [[ " $stages " == *" $1 "* ]]; }
failures=0
note() { echo "$*" | tee -a "$work/summary.txt"; }

gpus=$(nvidia-smi -L 2>/dev/null | wc -l)
if [ "$gpus" -lt 2 ]; then
  echo "multi_gpu: $gpus GPU(s) here; this script needs at least 2" >&2
  exit 2
fi
note "multi_gpu: $gpus GPUs, commit ${DCP_COMMIT:-$(git rev-parse --short HEAD 2>/dev/null || echo unknown)}, $(date -u +%FT%TZ)"
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env

# Build (and unpack the carried packages) with the single-GPU script's stage.
DCP_STAGES=build OUT="$work/build" bash scripts/device_test.sh >"$work/build.txt" 2>&1 ||
  { note "build: FAILED"; cp "$work/build.txt" "$out/"; exit 1; }
build="$(pwd)/build-gpu"
dcp_use_prefix /tmp/dcp-prefix  # device_test.sh's
run="$build/launch/dcp_run"
bench="$build/launch/bench/dcp_bench"
mpi=(mpirun --allow-run-as-root --bind-to none)
widths=()
for w in 2 4 8; do [ "$w" -le "$gpus" ] && widths+=("$w"); done

if has_stage suite; then
  # scripts_shellcheck is left to CI (no shellcheck on the GPU machines).
  DCP_REQUIRE_GPU=1 timeout 300 ctest --test-dir "$build" -j 8 --timeout 240 --output-on-failure \
      -E '^scripts_shellcheck$' \
      >"$work/ctest.log" 2>&1 || failures=$((failures + 1))
  note "ctest: $(grep -E 'tests passed' "$work/ctest.log" | tail -1)"
  # NCCL at np = GPUs: one GPU per rank, so the NCCL tests that need it run instead of skipping.
  for binary in multirank/worker_multirank_test multirank/engine_workload_multirank_test \
      multirank/cuda_communicator_multirank_test; do
    DCP_TEST_DEVICE=cuda DCP_REQUIRE_GPU=1 timeout 240 "${mpi[@]}" -np "$gpus" \
        "$build/tests/$binary" >"$work/$(basename "$binary")_np$gpus.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "$binary np $gpus: exit $code, $(grep -cE '\[  SKIPPED \]' "$work/$(basename "$binary")_np$gpus.log") skipped lines"
  done
fi

if has_stage deepseek; then
  for dtype in bf16 fp8_ds_mla; do
    for combine in ag_rs a2a; do
      log="$work/deepseek_${dtype}_${combine}.log"
      timeout 240 "${mpi[@]}" -np "$gpus" "$run" --config launch/configs/deepseek_v32.yaml \
          --comm nccl --combine "$combine" --kv-cache-dtype "$dtype" --check \
          --batch "${DCP_DEEPSEEK_BATCHES:-2q256_8q1kv4k,2q128kv512,8q1kv4k,q64kv3k_4q1kv4k}" >"$log" 2>&1
      code=$?
      [ "$code" -eq 0 ] || failures=$((failures + 1))
      note "deepseek_v32.yaml np $gpus $dtype $combine: exit $code | $(grep -E 'route|check' "$log" | tail -3 | tr '\n' ' ' | cut -c1-300)"
    done
  done
fi

if has_stage collectives; then
  for w in "${widths[@]}"; do
    timeout 200 "${mpi[@]}" -np "$w" "$bench" --mode collectives --device cuda --comm nccl \
        --model deepseek_v32 -b 4K -e 256M -f 4 -w 3 -n 10 --csv "$work/collectives_w$w.csv" \
        >"$work/collectives_w$w.txt" 2>&1 || failures=$((failures + 1))
    note "collectives W=$w: $(tail -1 "$work/collectives_w$w.txt")"
  done
fi

if has_stage routes; then
  for w in "${widths[@]}"; do
    timeout 200 "${mpi[@]}" -np "$w" "$bench" --mode routes --device cuda --comm nccl \
        --model deepseek_v32 --heads $((128 / w)) --index_topk 2048 -w 2 -n 5 \
        --batches "2q2k,4q1k,8q512,64q1kv4k" --csv "$work/routes_w$w.csv" \
        >"$work/routes_w$w.txt" 2>&1 || failures=$((failures + 1))
    timeout 120 "${mpi[@]}" -np "$w" "$bench" --mode engine --device cuda --comm nccl \
        --model deepseek_v32 --heads $((128 / w)) --index_topk 2048 -w 3 -n 50 \
        --batches "q1kv4k,64q1kv4k" --csv "$work/engine_w$w.csv" \
        >"$work/engine_w$w.txt" 2>&1 || failures=$((failures + 1))
    note "routes + engine W=$w: $(tail -1 "$work/engine_w$w.txt")"
  done
fi

if has_stage stall; then
  for stop_rank in 0 $((gpus - 1)); do
    timeout 120 bash tests/launch/stalled_rank.sh 5 "$gpus" "$stop_rank" "${mpi[@]}" -- "$run" \
        --device cuda --comm nccl --model deepseek_v32 --num-heads $((8 * gpus)) \
        >"$work/stall_rank$stop_rank.log" 2>&1
    code=$?
    [ "$code" -eq 0 ] || failures=$((failures + 1))
    note "stalled rank $stop_rank of $gpus (NCCL): exit $code | $(tail -1 "$work/stall_rank$stop_rank.log")"
  done
fi

note "failures: $failures"
tar -czf "$out/multi_gpu.tar.gz" -C "$work" . && cp "$work/summary.txt" "$out/"
[ "$failures" -eq 0 ]
