#!/usr/bin/env bash
# A rank that stops (SIGSTOP: alive, holding its connections, never answering) must not stall
# the job: every other rank exits within the collective timeout plus 10 s, mpirun exits 3 and
# a message names the timeout and the stopped rank.
#   stalled_rank.sh <timeout_s> <np> <rank to stop> <mpirun and its flags...> -- <dcp_run> [args]
# The job runs many iterations of a small batch with --comm-timeout <timeout_s>; the ranks
# report their pids (DCP_RUN_REPORT_PID) once the group runs, and the test stops one by pid.
set -uo pipefail
timeout_s=$1 np=$2 stop_rank=$3
shift 3
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
shift
dcp_run=$1
shift

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
export DCP_RUN_REPORT_PID=1
"${launcher[@]}" -np "$np" "$dcp_run" --batch 4q1s256_q64 --index-topk 128 --iters 1000000 \
  --comm-timeout "$timeout_s" "$@" >"$log/out" 2>"$log/err" &
mpirun_pid=$!

fail() {
  echo "FAIL: $*"
  echo "--- stdout ---"; tail -n 20 "$log/out"
  echo "--- stderr ---"; tail -n 40 "$log/err"
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill -CONT "$pid" 2>/dev/null; done
  kill -KILL "$mpirun_pid" 2>/dev/null
  for pid in "${pids[@]:-}"; do [ -n "$pid" ] && kill -KILL "$pid" 2>/dev/null; done
  exit 1
}

# Every rank's pid, once the group runs (60 s at most). A dcp_run without the pid hook: the
# children of mpirun in start order, after a few seconds (only for trying older builds).
declare -a pids=()
lines=()
for i in $(seq 600); do
  mapfile -t lines < <(grep -o 'rank [0-9]* pid [0-9]* running' "$log/err")
  [ "${#lines[@]}" -eq "$np" ] && break
  kill -0 "$mpirun_pid" 2>/dev/null || fail "the job ended before every rank ran"
  if [ "$i" -eq 100 ] && ! grep -q 'pid [0-9]* running' "$log/err"; then
    mapfile -t children < <(pgrep -P "$mpirun_pid" | sort -n)
    lines=()
    for r in "${!children[@]}"; do lines+=("rank $r pid ${children[$r]} running"); done
    [ "${#lines[@]}" -eq "$np" ] && break
  fi
  sleep 0.1
done
[ "${#lines[@]}" -eq "$np" ] || fail "only ${#lines[@]} of $np ranks reported their pid"
for line in "${lines[@]}"; do
  read -r _ rank _ pid _ <<<"$line"
  pids[$rank]=$pid
done
sleep 1  # inside the iterations
kill -STOP "${pids[$stop_rank]}" || fail "cannot stop rank $stop_rank (pid ${pids[$stop_rank]})"
stopped_at=$(date +%s.%N)
echo "stopped rank $stop_rank (pid ${pids[$stop_rank]}) with SIGSTOP, --comm-timeout $timeout_s s"

limit=$(awk -v t="$timeout_s" 'BEGIN { print t + 10 }')  # awk: bc is not everywhere
while :; do
  alive=0
  for rank in "${!pids[@]}"; do
    [ "$rank" -eq "$stop_rank" ] && continue
    # A zombie has exited; only a running (or sleeping) rank counts as alive.
    state=$(ps -o stat= -p "${pids[$rank]}" 2>/dev/null | cut -c1)
    [ -n "$state" ] && [ "$state" != "Z" ] && alive=$((alive + 1))
  done
  elapsed=$(awk -v now="$(date +%s.%N)" -v at="$stopped_at" 'BEGIN { printf "%.2f", now - at }')
  [ "$alive" -eq 0 ] && break
  if awk -v e="$elapsed" -v l="$limit" 'BEGIN { exit !(e > l) }'; then
    fail "$alive rank(s) still alive ${elapsed} s after rank $stop_rank stopped (limit $limit s)"
  fi
  sleep 0.1
done
echo "every other rank exited ${elapsed} s after rank $stop_rank stopped (limit $limit s)"

# mpirun itself: exit 3 once it has torn down the stopped rank too.
for _ in $(seq 300); do kill -0 "$mpirun_pid" 2>/dev/null || break; sleep 0.1; done
kill -CONT "${pids[$stop_rank]}" 2>/dev/null
if kill -0 "$mpirun_pid" 2>/dev/null; then fail "mpirun still runs 30 s after the ranks exited"; fi
wait "$mpirun_pid"
rc=$?
[ "$rc" -eq 3 ] || fail "mpirun exited $rc, expected 3"
grep -q "fatal: .*did not complete within ${timeout_s}" "$log/err" ||
  fail "no message naming the ${timeout_s} s timeout"
grep -q "fatal: .*rank ${stop_rank} did not answer a liveness probe" "$log/err" ||
  fail "the message does not name rank ${stop_rank}"
grep -m1 "fatal:" "$log/err"
echo "PASS: stalled rank $stop_rank brought down in ${elapsed} s, exit $rc"
