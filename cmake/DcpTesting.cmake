# Helpers that register tests with CTest.
#
# dcp_add_unit_test(name sources...): a single-process GoogleTest binary, each test its own
#   CTest entry (gtest_discover_tests).
# dcp_add_multirank_test(name NP <n> [UCX] COMMAND <binary> [args...]): runs <binary> under
#   `mpirun -np n` as CTest entry `<name>_np<n>[_ucx]`. UCX selects Open MPI's UCX transport with
#   the options this machine needs.

set(DCP_MPIEXEC_FLAGS --oversubscribe --bind-to none)
if(DEFINED ENV{USER} AND "$ENV{USER}" STREQUAL "root" OR "$ENV{HOME}" STREQUAL "/root")
  list(APPEND DCP_MPIEXEC_FLAGS --allow-run-as-root)
endif()
# The TCP/shared-memory path (ob1 with vader/tcp); UCX entries pick pml ucx explicitly.
set(DCP_MPI_DEFAULT_MCA --mca pml ob1 --mca btl self,vader,tcp)
set(DCP_MPI_UCX_MCA --mca pml ucx --mca pml_ucx_tls any --mca pml_ucx_devices any --mca btl ^openib)

function(dcp_add_unit_test name)
  add_executable(${name} ${ARGN})
  target_link_libraries(${name} PRIVATE dcp_test_support GTest::gtest GTest::gtest_main)
  gtest_discover_tests(${name} DISCOVERY_TIMEOUT 60 PROPERTIES TIMEOUT 300 LABELS unit)
endfunction()

function(dcp_add_multirank_test name)
  cmake_parse_arguments(ARG "UCX" "NP;TIMEOUT" "COMMAND" ${ARGN})
  set(mca ${DCP_MPI_DEFAULT_MCA})
  set(test_name ${name}_np${ARG_NP})
  if(ARG_UCX)
    set(mca ${DCP_MPI_UCX_MCA})
    set(test_name ${test_name}_ucx)
  endif()
  if(NOT ARG_TIMEOUT)
    set(ARG_TIMEOUT 300)
  endif()
  add_test(NAME ${test_name}
           COMMAND ${DCP_MPIEXEC} ${DCP_MPIEXEC_FLAGS} ${mca} -np ${ARG_NP} ${ARG_COMMAND})
  set_tests_properties(${test_name} PROPERTIES
    TIMEOUT ${ARG_TIMEOUT} LABELS multirank PROCESSORS ${ARG_NP}
    ENVIRONMENT "OMPI_ALLOW_RUN_AS_ROOT=1;OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1;OMPI_MCA_rmaps_base_oversubscribe=1")
endfunction()
