#!/usr/bin/env bash
# Installs what is missing (scripts/setup.sh), configures, builds on all cores and runs every
# test with CTest; the CTest summary line ends the output. Usage: scripts/test.sh [ctest args]
# Environment: DCP_BUILD_DIR (default build), DCP_WITH_CUDA (AUTO|ON|OFF, default AUTO).
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
# CTest lists skipped tests after its summary; repeat the summary so that it ends the output.
echo
grep -E '^[0-9]+% tests passed' "$build_dir/ctest.log" | tail -n 1 || echo "ctest did not run"
exit "$status"
