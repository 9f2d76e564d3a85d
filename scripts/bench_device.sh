#!/usr/bin/env bash
# The one command that benchmarks the CUDA ranks ON the GPU machine (issue 7; docs/PERFORMANCE.md,
# section "dcp_bench"). Run from the device tool, carrying .debs (scripts/fetch_debs.sh):
#
#   DCP_COMMIT=$(git rev-parse --short HEAD) scripts/bench_device.sh
#
#   1. builds dcp_bench, reusing scripts/device_test.sh's build (build-gpu, same flags and the
#      same unpacked .debs prefix) when it is there, else configuring it the same way;
#   2. dcp_bench --mode routes   on 1 rank at the DeepSeek-V3.2 dims: the vLLM
#      mla_sparse_mha_vs_mqa batches (q1..q8k x batch 1..64, extends) up to 16k tokens, per-rank
#      heads 16, 32, 64, 128;
#   3. dcp_bench --mode kernels  (ceilings: 1 GiB copy, 8192^3 bf16 GEMM; attention and GEMM
#      kernels at the default shapes; memory-bound kernels 1 MiB .. 256 MiB);
#   4. dcp_bench --mode collectives on every GPU (NCCL), and with one GPU also 2 ranks sharing
#      it through host-staged MPI (the only way to exercise W > 1 on one card);
#   5. scripts/peer_torch.py (torch SDPA cuDNN / flash, gather + bmm) on the routes shapes at
#      128 heads and on the kernels shapes;
#   6. scripts/plot_bench.py: PNGs and the targets table (targets.md).
# Every step has a time cap (the whole run stays inside the tool's 10 minutes; about 5 once
# built); dcp_bench streams its CSV rows, so a step cut short keeps what it measured.
# Results: everything under $DCP_BENCH_DIR (default out/bench, or /tmp/dcp-bench when $OUT is
# set). With $OUT (the device tool returns 8 files at most): bench_summary.txt, bench.tar.gz
# (every CSV, PNG and log) and, when $OUT was empty, routes.csv, kernels.csv, collectives.csv,
# peers.csv, routes_speedup.png and peers_dense_mha.png beside them.
# Environment: DCP_BUILD_DIR, DCP_BENCH_DEVICE (default cuda; cpu tries the plumbing here),
# DCP_BENCH_STEPS (default "routes kernels collectives peers
# plots"), DCP_BENCH_DEADLINE (seconds from start, default 560), DCP_OUTPUT_DTYPE (the routes
# and kernels modes' --output_dtype, default bf16), DCP_ROUTES_HEADS (default 16,32,64,128),
# DCP_ROUTES_ARGS,
# DCP_KERNELS_ARGS, DCP_COLLECTIVES_ARGS, DCP_PEERS_ARGS (extra arguments, appended).
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
deadline="${DCP_BENCH_DEADLINE:-560}"
steps="${DCP_BENCH_STEPS:-routes kernels collectives peers plots}"
has_step() { [[ " $steps " == *" $1 "* ]]; }
if [ -n "${OUT:-}" ]; then work="${DCP_BENCH_DIR:-/tmp/dcp-bench}"; else work="${DCP_BENCH_DIR:-out/bench}"; fi
mkdir -p "$work"
summary="$work/bench_summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }
failed=0

# Seconds a step may take: its cap, but leave `reserve` seconds for the steps after it.
budget() {
  local cap=$1 reserve=$2 left
  left=$(( deadline - ($(date +%s) - started) - reserve ))
  (( left < cap )) && cap=$left
  (( cap < 10 )) && cap=10
  echo "$cap"
}

# Keep NVLink multicast off (the GPU machines' notes ask for it) and let Open MPI run as root there.
# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo "${DCP_COMMIT:-unknown (set DCP_COMMIT)}")"
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader 2>&1 | head -8
  python3 -c 'import torch; print("torch", torch.__version__)' 2>&1 | tail -1
} | tee "$work/meta.txt" | tee -a "$summary"

# 1. Build (device_test.sh's prefix and flags).
prefix=/tmp/dcp-prefix
if [ -d "$prefix/usr" ]; then  # device_test.sh unpacked it in this call
  dcp_use_prefix "$prefix"
else
  dcp_unpack_debs .debs "$prefix" || note "bench_device: no $prefix and no .debs/ to unpack"
fi
build="${DCP_BUILD_DIR:-}"
if [ -z "$build" ]; then
  for dir in build-gpu build-device; do
    [ -f "$dir/CMakeCache.txt" ] && { build=$dir; break; }
  done
fi
build="${build:-build-gpu}"
echo "== build dcp_bench in $build ($(elapsed))"
if [ ! -f "$build/CMakeCache.txt" ]; then
  dcp_configure_gpu . "$build" "$prefix" >"$work/build.log" 2>&1 \
    || { tail -30 "$work/build.log"; note "configure: FAILED (see build.log)"; exit 1; }
fi
if ! ninja -C "$build" -j "$(nproc)" dcp_bench >>"$work/build.log" 2>&1; then
  grep -E "error|FAILED" "$work/build.log" | head -30
  note "build: FAILED (see build.log)"
  exit 1
fi
note "build: ok ($(elapsed))"
bench="$root/$build/launch/bench/dcp_bench"
gpus=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU')
(( gpus < 1 )) && gpus=1

# Runs dcp_bench under mpirun: step name, seconds, ranks, arguments...
run_bench() {
  local name=$1 seconds=$2 np=$3
  shift 3
  echo "== $name: np $np, at most ${seconds}s ($(elapsed))"
  timeout "$seconds" mpirun --allow-run-as-root --oversubscribe --bind-to none -np "$np" \
      "$bench" --device "${DCP_BENCH_DEVICE:-cuda}" "$@" >"$work/$name.txt" 2>"$work/$name.err"
  local code=$?
  tail -3 "$work/$name.txt"
  note "$name: exit $code$( ((code == 124)) && echo ' (time cap: partial CSV kept)') ($(elapsed))"
  (( code == 0 )) || failed=1
}

# 2-4. dcp_bench. The layer's and the dense kernel's out in bf16 by default: torch's peers
# (SDPA, the route composition) hand on bf16, so that is the like-for-like comparison.
out_dtype="${DCP_OUTPUT_DTYPE:-bf16}"
if has_step routes; then
  # shellcheck disable=SC2086
  run_bench routes "$(budget 200 190)" 1 --mode routes --model deepseek_v32 \
      --heads "${DCP_ROUTES_HEADS:-16,32,64,128}" --output_dtype "$out_dtype" \
      --max_tokens 16384 -w 1 -n 3 --csv "$work/routes.csv" ${DCP_ROUTES_ARGS:-}
  [ -f "$work/routes_crossover.csv" ] && tee -a "$summary" <"$work/routes_crossover.csv"
fi
if has_step kernels; then
  # shellcheck disable=SC2086
  run_bench kernels "$(budget 80 120)" 1 --mode kernels --model deepseek_v32 --heads 16,32,64,128 \
      --output_dtype "$out_dtype" -w 2 -n 10 -b 1M -e 256M -f 4 --csv "$work/kernels.csv" ${DCP_KERNELS_ARGS:-}
fi
if has_step collectives; then
  # shellcheck disable=SC2086
  run_bench collectives "$(budget 45 90)" "$gpus" --mode collectives --model deepseek_v32 \
      --heads 128 --comm auto -w 2 -n 10 -b 1M -e 256M -f 4 --csv "$work/collectives.csv" \
      ${DCP_COLLECTIVES_ARGS:-}
  if (( gpus == 1 )); then
    # shellcheck disable=SC2086
    run_bench collectives_np2_mpi "$(budget 45 75)" 2 --mode collectives --model deepseek_v32 \
        --heads 64 --comm mpi -w 1 -n 5 -b 1M -e 64M -f 4 \
        --csv "$work/collectives_np2_mpi.csv" ${DCP_COLLECTIVES_ARGS:-}
  fi
fi

# 5. Peers.
if has_step peers; then
  seconds=$(budget 110 25)
  echo "== peers: at most ${seconds}s ($(elapsed))"
  inputs=()
  [ -f "$work/routes.csv" ] && inputs+=(--routes "$work/routes.csv")
  [ -f "$work/kernels.csv" ] && inputs+=(--kernels "$work/kernels.csv")
  if (( ${#inputs[@]} )); then
    # shellcheck disable=SC2086
    timeout "$seconds" python3 scripts/peer_torch.py "${inputs[@]}" --heads 128 -w 1 -n 5 \
        --max-tokens 16384 --out "$work/peers.csv" ${DCP_PEERS_ARGS:-} \
        >"$work/peers.txt" 2>&1
    code=$?
    tail -3 "$work/peers.txt"
    note "peers: exit $code ($(elapsed))"
    (( code == 0 )) || failed=1
  else
    note "peers: no dcp_bench CSV to compare"
  fi
fi

# 6. Plots and the targets table.
if has_step plots; then
  args=()
  [ -f "$work/routes.csv" ] && args+=(--routes "$work/routes.csv")
  [ -f "$work/kernels.csv" ] && args+=(--kernels "$work/kernels.csv")
  [ -f "$work/peers.csv" ] && args+=(--peers "$work/peers.csv")
  if (( ${#args[@]} )); then
    timeout "$(budget 40 0)" python3 scripts/plot_bench.py "${args[@]}" \
        --targets "$work/targets.md" >"$work/plots.txt" 2>&1
    code=$?
    note "plots: exit $code ($(elapsed))"
    grep -v "^plot_bench.py: wrote" "$work/plots.txt" | tee -a "$summary"
    (( code == 0 )) || failed=1
  fi
fi

# Results: everything in one archive, the main files beside it (8 files at most in $OUT).
tar -czf "$work.tar.gz" -C "$(dirname "$work")" "$(basename "$work")" 2>/dev/null
if [ -n "${OUT:-}" ]; then
  mkdir -p "$OUT"
  existing=$(find "$OUT" -mindepth 1 -maxdepth 1 | head -1)
  cp "$work.tar.gz" "$OUT/bench.tar.gz"
  if [ -z "$existing" ]; then
    for file in routes.csv kernels.csv collectives.csv peers.csv routes_speedup.png \
                peers_dense_mha.png; do
      [ -f "$work/$file" ] && cp "$work/$file" "$OUT/"
    done
  fi
fi
echo
echo "================ dcp_bench summary ($(elapsed)) ================"
cat "$summary"
[ -n "${OUT:-}" ] && cp "$summary" "$OUT/bench_summary.txt"
exit "$failed"
