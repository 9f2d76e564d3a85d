#!/usr/bin/env bash
# An A/B of the engine's decode layer between two source trees on ONE GPU machine, run there
# (the device machines differ by up to ~3 us at one token, so A and B must share a call;
# docs/bench/h200-2026-12-03-ab-decode/). Builds dcp_bench in both trees, then runs
# `dcp_bench --mode engine` with DCP_BENCH_TIMELINE=1 in alternating processes (A, B, A, B, ...)
# and prints, per run, the layer rows and each attention kernel's span: from the end of the
# kernel it waits for (the latest end among the kernels that started before it) to its own end.
#   scripts/decode_ab_device.sh A_TREE
# A_TREE: a source tree of the other revision inside the working tree, made before the call
#   with `git archive REV | tar -x -C A_TREE` (the device copy has no git history; the folder
#   travels as untracked files, so delete it after the call and never commit it). B is this tree.
# Environment: DCP_AB_ROUNDS (default 2), DCP_AB_HEADS (16,128), DCP_AB_BATCHES
#   (q1s4k,8q1s4k,64q1s4k), DCP_AB_ENVS (VAR=VALUE settings for both sides, space-separated),
#   DCP_DEBS_DIR (.debs). Output in $OUT: summary.txt, timeline.txt, build logs.
#   scripts/decode_ab_device.sh --spans FILE  prints the spans of a saved timeline file (here).
set -uo pipefail

# Attention-kernel spans of every "timeline of one replayed layer" block in a dcp_bench log.
spans() {
  awk '
    /^=== / { run = $0 }
    /^timeline of one replayed layer/ { shape = $0; sub(/^timeline of one replayed layer, /, "", shape)
                                        sub(/:$/, "", shape); n = 0; next }
    shape != "" && $2 == "start" && $4 == "end" {
      name[n] = $1; start[n] = $3; end[n] = $5; ++n; next }
    shape != "" && n > 0 {
      for (i = 0; i < n; ++i) {
        if (name[i] !~ /^SparseMqa/) continue
        before = 0
        for (j = 0; j < n; ++j)
          if (j != i && start[j] < start[i] && end[j] < end[i] && end[j] > before) before = end[j]
        printf "%-28s %-24s attention span %6.2f us (ends %6.2f)\n", run, shape, end[i] - before, end[i]
      }
      shape = ""; n = 0 }
  ' "$1"
}
if [ "${1:-}" = "--spans" ]; then
  [ -f "${2:-}" ] || { echo "usage: $0 --spans TIMELINE_FILE" >&2; exit 2; }
  spans "$2"
  exit 0
fi

a_tree=${1:-}
if [ -z "$a_tree" ] || [ ! -f "$a_tree/CMakeLists.txt" ]; then
  echo "usage: $0 A_TREE (a source tree made with git archive; see the header)" >&2
  exit 2
fi
cd "$(dirname "$0")/.." || exit 1
out="${OUT:-/tmp/decode-ab-out}"
mkdir -p "$out"
started=$(date +%s)
elapsed() { echo "$(( $(date +%s) - started ))s"; }
summary="$out/summary.txt"
: >"$summary"
note() { echo "$*" | tee -a "$summary"; }

# shellcheck source=scripts/gpu_env.sh
. scripts/gpu_env.sh
dcp_gpu_env
prefix=/tmp/dcp-prefix
dcp_unpack_debs "${DCP_DEBS_DIR:-.debs}" "$prefix" || exit 2
[ -e "$a_tree/.deps" ] || ln -sfn "$(pwd)/.deps" "$a_tree/.deps"

build() {  # name source
  dcp_configure_gpu "$2" "/tmp/build-ab-$1" "$prefix" >"$out/build_$1.log" 2>&1 &&
    ninja -C "/tmp/build-ab-$1" dcp_bench >>"$out/build_$1.log" 2>&1
}
build a "$a_tree" || { note "build A: FAILED"; tail -20 "$out/build_a.log"; exit 1; }
build b . || { note "build B: FAILED"; tail -20 "$out/build_b.log"; exit 1; }
note "builds done ($(elapsed))"

log="$out/timeline.txt"
: >"$log"
for round in $(seq "${DCP_AB_ROUNDS:-2}"); do
  for side in a b; do
    # shellcheck disable=SC2086
    timeout 120 env DCP_BENCH_TIMELINE=1 ${DCP_AB_ENVS:-} mpirun -np 1 \
        "/tmp/build-ab-$side/launch/bench/dcp_bench" --mode engine --device cuda --comm nccl \
        --model deepseek_v32 --heads "${DCP_AB_HEADS:-16,128}" --index_topk 2048 -w 3 -n 50 \
        --batches "${DCP_AB_BATCHES:-q1s4k,8q1s4k,64q1s4k}" >"$out/one.txt" 2>&1
    note "=== $side round $round: exit $? ($(elapsed))"
    grep -E "^  [0-9]*q[0-9]" "$out/one.txt" | tee -a "$summary"
    { echo "=== $side round $round"; cat "$out/one.txt"; } >>"$log"
  done
done
rm -f "$out/one.txt"
note "attention kernel spans (us from the end of the kernel it waits for):"
spans "$log" | tee -a "$summary"
