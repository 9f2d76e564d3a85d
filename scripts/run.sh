#!/usr/bin/env bash
# The main job: builds dcp_run when needed (configure on first use, then an incremental build),
# and runs it on 4 CPU ranks under mpirun with the demo config and --check, printing the run
# summary. Extra arguments go to dcp_run (e.g. --json, --iters 20, --combine a2a).
# Environment: DCP_BUILD_DIR (default build), DCP_NP (ranks, default 4).
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir="${DCP_BUILD_DIR:-build}"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  bash scripts/setup.sh
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  cmake -S . -B "$build_dir" "${generator[@]}" -DCMAKE_BUILD_TYPE=Release >/dev/null
fi
# A no-op when dcp_run is up to date; the build log only when it fails.
if ! log=$(cmake --build "$build_dir" --parallel "$(nproc)" --target dcp_run 2>&1); then
  echo "$log" | tail -40 >&2
  echo "run.sh: building dcp_run failed" >&2
  exit 1
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
exec mpirun --oversubscribe --bind-to none -np "${DCP_NP:-4}" \
  "$build_dir/launch/dcp_run" --config launch/configs/demo.yaml --check "$@"
