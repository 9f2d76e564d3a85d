# shellcheck shell=bash
# Sourced (not run) by every script that runs on the GPU machine: device_test.sh,
# bench_device.sh, multi_gpu.sh and the per-area *_device.sh. One place for what each of them
# must set up, so that none forgets a part of it.
#
#   dcp_gpu_env                 the environment of every GPU run: NVLink multicast off in NCCL,
#                               PyTorch and NVSHMEM (the GPU machines' notes require it: a
#                               program that uses it can take the host's GPUs out of service),
#                               Open MPI as root and oversubscribed, unbuffered Python.
#   dcp_unpack_debs DEBS PREFIX the carried Debian packages (scripts/fetch_debs.sh) dpkg -x'ed
#                               into a fresh PREFIX (GoogleTest's fallback only where the machine
#                               has none), then dcp_use_prefix PREFIX; returns 2 with a message
#                               when DEBS holds no package.
#   dcp_use_prefix PREFIX       an unpacked PREFIX's libraries and CMake packages found:
#                               LD_LIBRARY_PATH and CMAKE_PREFIX_PATH exported.
#   dcp_cudnn_from_torch        appends torch's nvidia-cudnn libraries to LD_LIBRARY_PATH (after
#                               the system's libcudnn.so.9, which stays first).
#   dcp_configure_gpu SRC BUILD PREFIX [cmake args...]
#                               configures BUILD from SRC as every GPU script builds: Release,
#                               Ninja, CUDA on, sm_90a, PREFIX's unpacked packages; more cmake
#                               arguments after PREFIX.

dcp_gpu_env() {
  export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
  export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
  export OMPI_MCA_rmaps_base_oversubscribe=1
  export PYTHONUNBUFFERED=1
}

dcp_unpack_debs() {
  local debs=$1 prefix=$2 deb
  if ! ls "$debs"/*.deb >/dev/null 2>&1; then
    echo "no Debian packages in $debs: run scripts/fetch_debs.sh (with network) and carry .debs" >&2
    return 2
  fi
  rm -rf "$prefix" && mkdir -p "$prefix"
  for deb in "$debs"/*.deb; do dpkg -x "$deb" "$prefix"; done
  if ! find /usr /usr/local -path '*cmake/GTest/GTestConfig.cmake' 2>/dev/null | grep -q .; then
    echo "no GoogleTest on this machine: using the carried fallback"
    for deb in "$debs"/fallback/*.deb; do dpkg -x "$deb" "$prefix"; done
  fi
  dcp_use_prefix "$prefix"
}

dcp_use_prefix() {
  export LD_LIBRARY_PATH="$1/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  # Also in the environment: tests that configure projects of their own (the installed-package
  # consumer test) must find the same packages.
  export CMAKE_PREFIX_PATH="$1/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}"
}

dcp_cudnn_from_torch() {
  local dir
  dir=$(python3 -c 'import nvidia.cudnn; print(nvidia.cudnn.__path__[0])' 2>/dev/null) || return 0
  [ -n "$dir" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$dir/lib"
  return 0
}

dcp_configure_gpu() {
  local src=$1 build=$2 prefix=$3
  shift 3
  # absl 20220623 predates GCC 13's leaner headers: force <cstdint> into C++ sources (nvcc
  # chokes on a forced include, and the .cu files include what they use).
  cmake -S "$src" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release -DDCP_WITH_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES=90a -DCMAKE_PREFIX_PATH="$prefix/usr" \
    -DCMAKE_CXX_FLAGS="-include cstdint" "$@"
}
