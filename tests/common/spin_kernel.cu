#include "tests/common/spin_kernel.h"

#include <cstdint>

namespace dcp::testing {
namespace {

__device__ uint64_t GlobalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__global__ void SpinUntilSet(const volatile int* flag, uint64_t limit_ns) {
  const uint64_t started = GlobalTimerNs();
  while (*flag == 0 && GlobalTimerNs() - started < limit_ns) __nanosleep(1000);
}

}  // namespace

cudaError_t LaunchSpinUntilSet(const int* flag, double limit_s, cudaStream_t stream) {
  SpinUntilSet<<<1, 1, 0, stream>>>(flag, static_cast<uint64_t>(limit_s * 1e9));
  return cudaGetLastError();
}

}  // namespace dcp::testing
