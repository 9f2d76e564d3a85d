#!/usr/bin/env bash
# dcp_run --json over a problem file whose path is not valid UTF-8: the JSON summary replaces
# the bad byte (U+FFFD) on rank 0, and every rank exits 0 (the summary once threw there, after
# the last agreement, so rank 0 aborted while its peers exited 0).
#   json_path.sh <problem file> <mpirun and its flags...> -- <dcp_run>
set -uo pipefail
problem=$1
shift
launcher=()
while [ $# -gt 0 ] && [ "$1" != "--" ]; do launcher+=("$1"); shift; done
shift
dcp_run=$1

dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
bad="$dir/bad$(printf '\377')name.safetensors"
cp "$problem" "$bad" || exit 1
"${launcher[@]}" -np 2 "$dcp_run" --problem "$bad" --json >"$dir/out" 2>"$dir/err"
rc=$?
if [ "$rc" -ne 0 ]; then
  echo "FAIL: exit $rc (expected 0)"; cat "$dir/out" "$dir/err"; exit 1
fi
if ! grep -q "bad$(printf '\357\277\275')name" "$dir/out"; then
  echo "FAIL: the summary does not carry the path with U+FFFD"; cat "$dir/out"; exit 1
fi
echo "PASS: --json with a non-UTF-8 path"
