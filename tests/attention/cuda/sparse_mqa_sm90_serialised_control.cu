// The negative control of sass_check.sh: a kernel whose wgmmas ptxas must serialise (it reads an
// accumulator while the wgmma that writes it may be in flight: warnings C7514 / C7517, expected
// here). The check must refuse its SASS. Compiled, never launched.
#include <cstdint>

#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

__global__ void SparseMqaSm90SerialisedControl(float* out, uint64_t desc_a, uint64_t desc_b) {
#if SPARSE_MQA_SM90_ENABLED
  using namespace sm90;
  float d[32];
  for (int i = 0; i < 32; ++i) d[i] = 0.f;
  float sum = 0.f;
  // 16 wgmmas, each followed by a read of its accumulator: 16 waits once serialised.
#pragma unroll
  for (int k = 0; k < 16; ++k) {
    WgmmaFence();
    WgmmaM64N64K16SS(d, desc_a + k, desc_b + k, 1);
    WgmmaCommit();
    sum += d[k];
  }
  WgmmaWait<0>();
  out[threadIdx.x] = sum + d[threadIdx.x & 31];
#else
  (void)out, (void)desc_a, (void)desc_b;
#endif
}

}  // namespace dcp::cuda
