#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures, builds on all cores and runs every
# test with CTest; the CTest summary line ends the output. Usage: scripts/test.sh [ctest args]
# Environment: DCP_BUILD_DIR (default build), DCP_WITH_CUDA (AUTO|ON|OFF, default AUTO),
# DCP_SANITIZE (quick|full|0, default quick: see the end of this script).
set -euo pipefail
cd "$(dirname "$0")/.."

bash scripts/setup.sh

build_dir="${DCP_BUILD_DIR:-build}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
generator=()
command -v ninja >/dev/null && generator=(-G Ninja)
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release \
    -DDCP_WITH_CUDA="${DCP_WITH_CUDA:-AUTO}"
fi
cmake --build "$build_dir" --parallel "$(nproc)"

set +e
(cd "$build_dir" && ctest --output-on-failure --timeout 600 "$@") 2>&1 | tee "$build_dir/ctest.log"
status=${PIPESTATUS[0]}
set -e
# The sanitizer subset (scripts/sanitize.sh --quick: ASan+UBSan build of the launcher-facing
# targets, its end-to-end runs, the fuzz targets for DCP_FUZZ_SECONDS each and the stalled-rank
# tests), when clang is there; DCP_SANITIZE=0 skips it, DCP_SANITIZE=full runs the whole suite.
sanitize_status=0
sanitize_line=""
if [ "${DCP_SANITIZE:-quick}" != "0" ] && command -v clang++ >/dev/null; then
  sanitize_args=(--quick)
  [ "${DCP_SANITIZE:-quick}" = "full" ] && sanitize_args=()
  set +e
  DCP_SANITIZE_BUILD_DIR="${DCP_SANITIZE_BUILD_DIR:-$build_dir-sanitize}" \
    bash scripts/sanitize.sh "${sanitize_args[@]}"
  sanitize_status=$?
  set -e
  sanitize_line="sanitizers (scripts/sanitize.sh ${sanitize_args[*]}): exit $sanitize_status"
fi
# CTest lists skipped tests after its summary; repeat the summary so that it ends the output.
echo
[ -n "$sanitize_line" ] && echo "$sanitize_line"
grep -E '^[0-9]+% tests passed' "$build_dir/ctest.log" | tail -n 1 || echo "ctest did not run"
[ "$status" -eq 0 ] && status=$sanitize_status
exit "$status"
