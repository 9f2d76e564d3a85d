#include "workspace/cpu/fp8_rows_cpu.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "core/kv_cache_format.h"
#include "core/status.h"
#include "workspace/fp8_rows_check.h"

namespace dcp::cpu {
namespace {

namespace f = fp8_ds_mla;

template <typename T>
void QuantizeRow(const T* kv_c, const T* k_pe, uint8_t* row) {
  for (int t = 0; t < f::kNumTiles; ++t) {
    const T* x = kv_c + t * f::kTileSize;
    float amax = 0.0f;
    for (int i = 0; i < f::kTileSize; ++i) amax = std::max(amax, std::fabs(to_float(x[i])));
    const float scale = std::max(amax / f::kFp8Max, FLT_MIN);
    for (int i = 0; i < f::kTileSize; ++i) {
      row[t * f::kTileSize + i] = f::FloatToE4m3(to_float(x[i]) / scale);
    }
    std::memcpy(row + f::kScaleOffset + 4 * t, &scale, 4);
  }
  for (int i = 0; i < f::kRopeDim; ++i) {
    const bf16 value = float_to_bf16(to_float(k_pe[i]));
    std::memcpy(row + f::kRopeOffset + 2 * i, &value.bits, 2);
  }
}

template <typename T>
void Write(const Fp8DsMlaWriteParams& p) {
  const T* kv_c = static_cast<const T*>(p.kv_c);
  const T* k_pe = static_cast<const T*>(p.k_pe);
  for (int64_t i = 0; i < p.num_rows; ++i) {
    const int64_t slot = p.slot_mapping[i];
    if (slot < 0 || slot >= p.num_slots) continue;
    QuantizeRow(kv_c + i * p.kv_c_row_stride, k_pe + i * p.k_pe_row_stride,
                p.cache + slot * f::kRowBytes);
  }
}

template <typename T>
void Gather(const Fp8DsMlaGatherParams& p) {
  T* dst = static_cast<T*>(p.dst);
  float row[f::kRowWidth];
  for (int64_t i = 0; i < p.num_rows; ++i) {
    T* target = dst + i * p.dst_row_stride;
    const int64_t from = p.index[i];
    if (from < 0 || from >= p.num_src_rows) {
      std::fill(row, row + f::kRowWidth, 0.0f);
    } else {
      f::DequantizeRow(p.cache + from * f::kRowBytes, row);
    }
    for (int c = 0; c < f::kRowWidth; ++c) target[c] = from_float<T>(row[c]);
  }
}

}  // namespace

absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& p) {
  DCP_RETURN_IF_ERROR(CheckFp8DsMlaWrite(p));
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.dtype == DType::kF32) {
    Write<float>(p);
  } else {
    Write<bf16>(p);
  }
  return absl::OkStatus();
}

absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& p) {
  DCP_RETURN_IF_ERROR(CheckFp8DsMlaGather(p));
  if (p.num_rows == 0) return absl::OkStatus();
  if (p.dst_dtype == DType::kF32) {
    Gather<float>(p);
  } else {
    Gather<bf16>(p);
  }
  return absl::OkStatus();
}

}  // namespace dcp::cpu
