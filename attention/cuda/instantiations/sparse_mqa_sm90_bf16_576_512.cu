// Sparse MQA, bf16, head_dim 576 / v_dim 512: the warp-specialised wgmma kernel (sm_90a) with
// fp32 output rows (Sm90Epilogue::kF32).
#include <atomic>

#include "attention/cuda/sparse_mqa_sm90_kernel.cuh"

namespace dcp::cuda {

template absl::Status LaunchSparseMqaSm90<576, 512, KvCacheDType::kBF16, Sm90Epilogue::kF32>(
    const SparseMqaParams&, const SparseMqaSplit&, cudaStream_t);

bool SparseMqaSm90Available() {
  // The binary the runtime picked for this device: sm_90 code means the sm_90a build is there
  // (other architectures compile the kernel as a stub). Cached per device.
  static std::atomic<int> cached[64] = {};  // 0 unknown, 1 no, 2 yes
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0) return false;
  if (device < 64 && cached[device].load() != 0) return cached[device].load() == 2;
  int major = 0;
  bool available = false;
  if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) == cudaSuccess &&
      major == 9) {
    cudaFuncAttributes attributes;
    if (cudaFuncGetAttributes(&attributes, SparseMqaSm90Kernel<576, 512, KvCacheDType::kBF16>) == cudaSuccess) {
      available = attributes.binaryVersion == 90;
    } else {
      cudaGetLastError();  // a missing image is not an error of the next call
    }
  }
  if (device < 64) cached[device].store(available ? 2 : 1);
  return available;
}

}  // namespace dcp::cuda
