#include "core/cuda/device_info.h"

#include <cuda_runtime.h>

#include <atomic>

namespace dcp::cuda {
namespace {

constexpr int kMaxDevices = 64;

// attribute of the current device, cached per device in `cache` (devices past kMaxDevices are
// queried every time).
int CachedAttribute(cudaDeviceAttr attribute, std::atomic<int> (&cache)[kMaxDevices]) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return 0;
  if (device < kMaxDevices && cache[device].load() > 0) return cache[device].load();
  int value = 0;
  if (cudaDeviceGetAttribute(&value, attribute, device) != cudaSuccess || value < 0) return 0;
  if (device < kMaxDevices) cache[device].store(value);
  return value;
}

}  // namespace

int CurrentDeviceSmCount() {
  static std::atomic<int> cache[kMaxDevices] = {};
  return CachedAttribute(cudaDevAttrMultiProcessorCount, cache);
}

int CurrentDeviceComputeMajor() {
  static std::atomic<int> cache[kMaxDevices] = {};
  return CachedAttribute(cudaDevAttrComputeCapabilityMajor, cache);
}

}  // namespace dcp::cuda
