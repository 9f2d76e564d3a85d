# One static library per folder of the source tree, dependencies only downward
# (DESIGN.md section 8): core < collectives, attention, workspace < runtime < launch.
#
# dcp_add_layer(<folder> [DEPENDS <lower targets and libraries>...]) defines dcp_<folder>
# (alias dcp::<folder>). A target does not see the source root: its include path holds one
# folder per layer it may use, each a link named after the folder
# (<build>/layers/<folder>/<folder> -> <source>/<folder>), and a layer's path reaches a user only
# through its PUBLIC dependencies. So `#include "runtime/worker.h"` in attention/ does not
# compile: an include that runs back up fails the build instead of slipping in.
function(dcp_add_layer folder)
  cmake_parse_arguments(ARG "" "" "DEPENDS" ${ARGN})
  set(target dcp_${folder})
  set(view "${PROJECT_BINARY_DIR}/layers/${folder}")
  file(MAKE_DIRECTORY "${view}")
  if(NOT EXISTS "${view}/${folder}")
    file(CREATE_LINK "${PROJECT_SOURCE_DIR}/${folder}" "${view}/${folder}" SYMBOLIC)
  endif()
  add_library(${target} STATIC)
  add_library(dcp::${folder} ALIAS ${target})
  set_target_properties(${target} PROPERTIES EXPORT_NAME ${folder})
  target_compile_features(${target} PUBLIC cxx_std_20)
  target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra>)
  target_include_directories(${target} PUBLIC
    $<BUILD_INTERFACE:${view}>
    $<INSTALL_INTERFACE:include/dcp>)
  target_link_libraries(${target} PUBLIC ${ARG_DEPENDS})
  if(DCP_CUDA_ENABLED)
    target_compile_options(${target} PRIVATE $<$<COMPILE_LANGUAGE:CUDA>:${DCP_CUDA_FLAGS}>)
  endif()
endfunction()
