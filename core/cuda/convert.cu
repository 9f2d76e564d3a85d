#include <cuda_bf16.h>

#include <algorithm>

#include "core/cuda/convert.h"
#include "core/cuda/cuda_status.h"

namespace dcp::cuda {
namespace {

// Bit for bit dtype.h's float_to_bf16 (round to nearest even, NaN -> its quiet NaN), so CPU and
// CUDA ranks store identical bf16 (CUDA's __float2bfloat16_rn returns a canonical 0x7FFF NaN).
__device__ __forceinline__ uint16_t F32ToBf16Bits(float value) {
  uint32_t word = __float_as_uint(value);
  if ((word & 0x7f800000u) == 0x7f800000u && (word & 0x007fffffu) != 0) {
    return static_cast<uint16_t>((word >> 16) | 0x0040u);
  }
  word += 0x7fffu + ((word >> 16) & 1u);
  return static_cast<uint16_t>(word >> 16);
}

__device__ __forceinline__ uint32_t PackPair(float lo, float hi) {
  return uint32_t(F32ToBf16Bits(lo)) | (uint32_t(F32ToBf16Bits(hi)) << 16);
}

// One thread converts 8 elements per step (a 16-byte bf16 vector / two float4), grid-stride;
// the tail (count % 8) is done element by element by the first threads.
__global__ void F32ToBf16Kernel(__nv_bfloat16* __restrict__ dst, const float* __restrict__ src,
                                size_t count, bool vectorized) {
  const size_t thread = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (vectorized) {
    const size_t vectors = count / 8;
    for (size_t v = thread; v < vectors; v += stride) {
      const float4 a = reinterpret_cast<const float4*>(src)[2 * v];
      const float4 b = reinterpret_cast<const float4*>(src)[2 * v + 1];
      reinterpret_cast<uint4*>(dst)[v] =
          make_uint4(PackPair(a.x, a.y), PackPair(a.z, a.w), PackPair(b.x, b.y), PackPair(b.z, b.w));
    }
    done = vectors * 8;
  }
  for (size_t i = done + thread; i < count; i += stride) {
    dst[i] = __nv_bfloat16_raw{F32ToBf16Bits(src[i])};
  }
}

__global__ void Bf16ToF32Kernel(float* __restrict__ dst, const __nv_bfloat16* __restrict__ src,
                                size_t count, bool vectorized) {
  const size_t thread = blockIdx.x * size_t(blockDim.x) + threadIdx.x;
  const size_t stride = size_t(gridDim.x) * blockDim.x;
  size_t done = 0;
  if (vectorized) {
    const size_t vectors = count / 8;
    for (size_t v = thread; v < vectors; v += stride) {
      const uint4 in = reinterpret_cast<const uint4*>(src)[v];
      const auto* pairs = reinterpret_cast<const __nv_bfloat162*>(&in);
      float2 f[4];
#pragma unroll
      for (int i = 0; i < 4; ++i) f[i] = __bfloat1622float2(pairs[i]);
      reinterpret_cast<float4*>(dst)[2 * v] = make_float4(f[0].x, f[0].y, f[1].x, f[1].y);
      reinterpret_cast<float4*>(dst)[2 * v + 1] = make_float4(f[2].x, f[2].y, f[3].x, f[3].y);
    }
    done = vectors * 8;
  }
  for (size_t i = done + thread; i < count; i += stride) dst[i] = __bfloat162float(src[i]);
}

bool Aligned16(const void* a, const void* b) {
  return (reinterpret_cast<uintptr_t>(a) % 16 == 0) && (reinterpret_cast<uintptr_t>(b) % 16 == 0);
}

int GridFor(size_t work) {
  const size_t blocks = (work + 255) / 256;
  return static_cast<int>(std::clamp<size_t>(blocks, 1, 132 * 16));
}

}  // namespace

absl::Status Convert(void* dst, DType dst_dtype, const void* src, DType src_dtype, size_t count,
                     cudaStream_t stream) {
  if (count == 0) return absl::OkStatus();
  DCP_CHECK_ARG(dst != nullptr && src != nullptr, "Convert: dst and src must not be null");
  if (dst_dtype == src_dtype) {
    DCP_CUDA_CHECK(cudaMemcpyAsync(dst, src, count * dtype_size(dst_dtype),
                                   cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }
  const bool vectorized = Aligned16(dst, src);
  if (src_dtype == DType::kF32 && dst_dtype == DType::kBF16) {
    F32ToBf16Kernel<<<GridFor(count / 8 + 1), 256, 0, stream>>>(
        static_cast<__nv_bfloat16*>(dst), static_cast<const float*>(src), count, vectorized);
    DCP_CUDA_LAUNCH_CHECK("F32ToBf16Kernel");
    return absl::OkStatus();
  }
  if (src_dtype == DType::kBF16 && dst_dtype == DType::kF32) {
    Bf16ToF32Kernel<<<GridFor(count / 8 + 1), 256, 0, stream>>>(
        static_cast<float*>(dst), static_cast<const __nv_bfloat16*>(src), count, vectorized);
    DCP_CUDA_LAUNCH_CHECK("Bf16ToF32Kernel");
    return absl::OkStatus();
  }
  return DCP_ERROR(InvalidArgument, "Convert: %s -> %s is not supported (F32 <-> BF16 only)",
                   dtype_name(src_dtype), dtype_name(dst_dtype));
}

}  // namespace dcp::cuda
