# Resolves DCP_WITH_CUDA (AUTO|ON|OFF) into DCP_CUDA_ENABLED and, when on, enables the CUDA
# language, finds the toolkit (cudart, cuBLAS) and NCCL (dcp::nccl).
include(CheckLanguage)
set(DCP_CUDA_ENABLED OFF)
string(TOUPPER "${DCP_WITH_CUDA}" _dcp_cuda_mode)
if(NOT _dcp_cuda_mode MATCHES "^(AUTO|ON|OFF)$")
  message(FATAL_ERROR "DCP_WITH_CUDA must be AUTO, ON or OFF, got '${DCP_WITH_CUDA}'")
endif()

if(NOT _dcp_cuda_mode STREQUAL "OFF")
  if(NOT CMAKE_CUDA_COMPILER AND NOT DEFINED ENV{CUDACXX})
    find_program(_dcp_nvcc nvcc HINTS /usr/local/cuda/bin)
    if(_dcp_nvcc)
      set(CMAKE_CUDA_COMPILER "${_dcp_nvcc}" CACHE FILEPATH "nvcc")
    endif()
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    get_filename_component(_dcp_cuda_bin "${CMAKE_CUDA_COMPILER}" DIRECTORY)
    get_filename_component(_dcp_cuda_root "${_dcp_cuda_bin}" DIRECTORY)
    # NCCL lives inside the toolkit prefix on the CPU machines and in the system folders on
    # the GPU machine; either is fine.
    find_path(DCP_NCCL_INCLUDE_DIR nccl.h
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_dcp_cuda_root}
      PATH_SUFFIXES include targets/x86_64-linux/include)
    find_library(DCP_NCCL_LIBRARY NAMES nccl
      HINTS ${NCCL_ROOT} $ENV{NCCL_ROOT} ${_dcp_cuda_root}
      PATH_SUFFIXES lib lib64 targets/x86_64-linux/lib lib/x86_64-linux-gnu)
  endif()
  if(CMAKE_CUDA_COMPILER AND DCP_NCCL_INCLUDE_DIR AND DCP_NCCL_LIBRARY)
    set(DCP_CUDA_ENABLED ON)
  elseif(_dcp_cuda_mode STREQUAL "ON")
    message(FATAL_ERROR "DCP_WITH_CUDA=ON but nvcc (${CMAKE_CUDA_COMPILER}) or NCCL "
                        "(header ${DCP_NCCL_INCLUDE_DIR}, library ${DCP_NCCL_LIBRARY}) was not found")
  else()
    message(STATUS "dcp: CUDA ranks off (nvcc or NCCL not found)")
  endif()
endif()

if(DCP_CUDA_ENABLED)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90a)
  endif()
  enable_language(CUDA)
  # CMake 3.25 does not know nvcc 13's C++20 flag; pass it directly (see dcp_cuda_options).
  set(DCP_CUDA_FLAGS -std=c++20 --expt-relaxed-constexpr -lineinfo)
  find_package(CUDAToolkit REQUIRED)
  add_library(dcp_nccl INTERFACE)
  add_library(dcp::nccl ALIAS dcp_nccl)
  target_include_directories(dcp_nccl INTERFACE $<BUILD_INTERFACE:${DCP_NCCL_INCLUDE_DIR}>)
  target_link_libraries(dcp_nccl INTERFACE $<BUILD_INTERFACE:${DCP_NCCL_LIBRARY}>)
  message(STATUS "dcp: CUDA ranks on: nvcc ${CMAKE_CUDA_COMPILER_VERSION}, arch "
                 "${CMAKE_CUDA_ARCHITECTURES}, NCCL ${DCP_NCCL_LIBRARY}")
endif()
