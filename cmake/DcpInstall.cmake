# `cmake --install` puts the public headers under include/dcp/ (core/, collectives/,
# attention/, workspace/, runtime/, kept as folders so that `#include "runtime/dcp.h"` works), one
# static library per layer under lib/ (libdcp_core.a ... libdcp_runtime.a), and a CMake package (dcpConfig.cmake, its version file, exported targets) under
# lib/cmake/dcp, so that an engine writes
#   find_package(dcp REQUIRED)
#   target_link_libraries(engine PRIVATE dcp::dcp)     # every layer; or dcp::core etc.
# dcp_run and the example configs go to bin/ and share/dcp/configs (launch/CMakeLists.txt).
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

set(DCP_INSTALL_CMAKEDIR "${CMAKE_INSTALL_LIBDIR}/cmake/dcp")

foreach(_dcp_folder core collectives attention workspace runtime)
  install(DIRECTORY "${PROJECT_SOURCE_DIR}/${_dcp_folder}/"
          DESTINATION "${CMAKE_INSTALL_INCLUDEDIR}/dcp/${_dcp_folder}"
          FILES_MATCHING PATTERN "*.h")
endforeach()

set(_dcp_export_targets dcp dcp_core dcp_collectives dcp_attention dcp_workspace dcp_runtime)
if(DCP_CUDA_ENABLED)
  # dcp links dcp::nccl, an INTERFACE target that only carries NCCL's build-tree paths; give
  # it the same (absolute, system) paths for the installed package and export it as dcp::nccl.
  target_include_directories(dcp_nccl INTERFACE $<INSTALL_INTERFACE:${DCP_NCCL_INCLUDE_DIR}>)
  target_link_libraries(dcp_nccl INTERFACE $<INSTALL_INTERFACE:${DCP_NCCL_LIBRARY}>)
  set_target_properties(dcp_nccl PROPERTIES EXPORT_NAME nccl)
  list(APPEND _dcp_export_targets dcp_nccl)
endif()

install(TARGETS ${_dcp_export_targets}
        EXPORT dcpTargets
        ARCHIVE DESTINATION "${CMAKE_INSTALL_LIBDIR}"
        LIBRARY DESTINATION "${CMAKE_INSTALL_LIBDIR}")
install(EXPORT dcpTargets
        NAMESPACE dcp::
        DESTINATION "${DCP_INSTALL_CMAKEDIR}")

# dcpConfig.cmake: the dependencies dcp's interface names, then the targets.
set(DCP_CONFIG_CUDA "${DCP_CUDA_ENABLED}")
file(WRITE "${PROJECT_BINARY_DIR}/dcpConfig.cmake.in" [=[
# Package configuration of dcp @PROJECT_VERSION@ (decode-context-parallel attention layer).
# Provides dcp::dcp (every layer) and the layers dcp::core, dcp::collectives, dcp::attention,
# dcp::workspace, dcp::runtime (static libraries); built with CUDA ranks: @DCP_CONFIG_CUDA@.
@PACKAGE_INIT@

include(CMakeFindDependencyMacro)
find_dependency(Threads)
find_dependency(MPI COMPONENTS C)
find_dependency(absl)
set(dcp_WITH_CUDA @DCP_CONFIG_CUDA@)
if(dcp_WITH_CUDA)
  find_dependency(CUDAToolkit)
endif()

include("${CMAKE_CURRENT_LIST_DIR}/dcpTargets.cmake")
check_required_components(dcp)
]=])
configure_package_config_file(
  "${PROJECT_BINARY_DIR}/dcpConfig.cmake.in" "${PROJECT_BINARY_DIR}/dcpConfig.cmake"
  INSTALL_DESTINATION "${DCP_INSTALL_CMAKEDIR}")
write_basic_package_version_file(
  "${PROJECT_BINARY_DIR}/dcpConfigVersion.cmake"
  VERSION "${PROJECT_VERSION}"
  COMPATIBILITY SameMinorVersion)
install(FILES "${PROJECT_BINARY_DIR}/dcpConfig.cmake" "${PROJECT_BINARY_DIR}/dcpConfigVersion.cmake"
        DESTINATION "${DCP_INSTALL_CMAKEDIR}")
