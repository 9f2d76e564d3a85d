#!/usr/bin/env bash
# AddressSanitizer + UndefinedBehaviorSanitizer build of the CPU path (clang, CUDA off, the
# fuzz targets as libFuzzer binaries) and the CTest suite under it. Zero findings in project
# code is the bar: any ASan or UBSan report fails its test (halt_on_error), and LeakSanitizer
# reports every leak except Open MPI's own (scripts/sanitize.supp).
# Usage: scripts/sanitize.sh [--quick] [ctest args]
#   --quick  the subset CI runs: only the launcher-facing targets are built (dcp_run, dcp_bench,
#            make_problem, the fuzz targets, the launcher's unit tests) and CTest runs every
#            dcp_run end-to-end entry, the launcher's unit tests, the fuzz replays and runs,
#            and the stalled-rank tests. Without it: the whole build and the whole suite.
# Environment: DCP_SANITIZE_BUILD_DIR (default build-sanitize), DCP_FUZZ_SECONDS (default 20).
set -euo pipefail
cd "$(dirname "$0")/.."
quick=0
if [ "${1:-}" = "--quick" ]; then
  quick=1
  shift
fi

if ! command -v clang++ >/dev/null; then
  echo "sanitize: clang++ not found (scripts/setup.sh installs it)" >&2
  exit 1
fi
build_dir="${DCP_SANITIZE_BUILD_DIR:-build-sanitize}"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
flags="-fsanitize=address,undefined -fno-sanitize-recover=undefined -fno-omit-frame-pointer -g"
if [ ! -f "$build_dir/CMakeCache.txt" ]; then
  generator=()
  command -v ninja >/dev/null && generator=(-G Ninja)
  # -O1: the kernels' tests stay fast enough; the sanitizers see what -O2 would keep.
  CC=clang CXX=clang++ cmake -S . -B "$build_dir" "${generator[@]}" \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_C_FLAGS_RELWITHDEBINFO="-O1" \
    -DCMAKE_CXX_FLAGS_RELWITHDEBINFO="-O1" -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" \
    -DCMAKE_EXE_LINKER_FLAGS="-fsanitize=address,undefined" -DDCP_WITH_CUDA=OFF \
    -DDCP_FUZZ_COVERAGE=ON -DDCP_FUZZ_SECONDS="${DCP_FUZZ_SECONDS:-20}"
fi
ctest_filter=()
if [ "$quick" -eq 1 ]; then
  cmake --build "$build_dir" --parallel "$(nproc)" --target dcp_run dcp_bench make_problem \
    fuzz_safetensors_problem fuzz_yaml_config fuzz_batch_spec fuzz_engine_step batch_spec_test \
    run_config_test \
    safetensors_test limits_test problem_test synthetic_test
  ctest_filter=(-R "^(launch_|fuzz_|bench_long|dcp_run_version|dcp_bench_version|BatchSpecTest|RunConfigTest|SafetensorsTest|LimitsTest|ProblemTest|SyntheticTest)"
                -E "launch_install_consumer")
else
  cmake --build "$build_dir" --parallel "$(nproc)"
fi

supp="$PWD/scripts/sanitize.supp"
# fast_unwind_on_malloc=0: full stacks for leaks, so a suppression can name the Open MPI
# library an allocation came from even when the leak is reported after its plugin unloaded.
export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=0:fast_unwind_on_malloc=0:strict_string_checks=1:detect_stack_use_after_return=1:check_initialization_order=1:allocator_may_return_null=1"
export LSAN_OPTIONS="suppressions=$supp:print_suppressions=0:fast_unwind_on_malloc=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
set +e
(cd "$build_dir" && ctest --output-on-failure --timeout 900 "${ctest_filter[@]}" "$@") 2>&1 | tee "$build_dir/ctest.log"
status=${PIPESTATUS[0]}
set -e
# A report that did not fail its test (a rank's output mpirun swallowed) still fails the run.
if grep -qE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$build_dir/ctest.log"; then
  echo "sanitize: sanitizer reports in the log:" >&2
  grep -nE "ERROR: (AddressSanitizer|LeakSanitizer)|runtime error:" "$build_dir/ctest.log" | head >&2
  status=1
fi
echo
grep -E '^[0-9]+% tests passed' "$build_dir/ctest.log" | tail -n 1 || echo "ctest did not run"
exit "$status"
