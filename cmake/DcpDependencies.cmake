# Every dependency is found on the system (scripts/setup.sh installs them); nothing is
# downloaded at build time.
find_package(Threads REQUIRED)
find_package(MPI REQUIRED COMPONENTS C)
find_package(absl REQUIRED)
find_package(nlohmann_json 3 REQUIRED)
find_package(yaml-cpp REQUIRED)
if(DCP_BUILD_TESTS)
  find_package(GTest REQUIRED)
endif()
if(DCP_BUILD_BENCH)
  find_package(benchmark REQUIRED)
endif()

# UCX is Open MPI's transport (pml ucx); we do not link it, only report it, so that a build
# log says whether the multi-rank UCX tests can run.
find_package(PkgConfig QUIET)
set(DCP_UCX_VERSION "not found")
if(PkgConfig_FOUND)
  pkg_check_modules(UCX QUIET ucx)
  if(UCX_FOUND)
    set(DCP_UCX_VERSION "${UCX_VERSION}")
  endif()
endif()
find_program(DCP_UCX_INFO ucx_info)

find_program(DCP_MPIEXEC NAMES mpirun mpiexec HINTS ${MPIEXEC_EXECUTABLE})
if(NOT DCP_MPIEXEC)
  message(FATAL_ERROR "mpirun not found: run scripts/setup.sh (openmpi-bin)")
endif()
