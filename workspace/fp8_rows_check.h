// The argument checks of the fp8_ds_mla cache write and gather (fp8_rows_params.h), shared by
// the CPU and CUDA implementations so both reject the same calls with the same message.
#pragma once

#include <cstdint>

#include "absl/status/status.h"
#include "core/kv_cache_format.h"
#include "core/status.h"
#include "workspace/fp8_rows_params.h"

namespace dcp {

inline absl::Status CheckFp8DsMlaWrite(const Fp8DsMlaWriteParams& p) {
  DCP_CHECK_ARG(p.num_rows >= 0 && p.num_slots >= 0,
                "Fp8DsMlaWrite: num_rows %d and num_slots %d must be >= 0", p.num_rows,
                p.num_slots);
  DCP_CHECK_ARG(p.cache_row_bytes == fp8_ds_mla::kRowBytes,
                "Fp8DsMlaWrite: fp8_ds_mla rows are %d bytes, got a cache row stride of %d bytes",
                fp8_ds_mla::kRowBytes, p.cache_row_bytes);
  DCP_CHECK_ARG(p.dtype == DType::kF32 || p.dtype == DType::kBF16,
                "Fp8DsMlaWrite: input dtype %s is not F32 or BF16", dtype_name(p.dtype));
  if (p.num_rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.kv_c != nullptr && p.k_pe != nullptr && p.slot_mapping != nullptr,
                "Fp8DsMlaWrite: kv_c, k_pe and slot_mapping must not be null");
  DCP_CHECK_ARG(p.num_slots == 0 || p.cache != nullptr, "Fp8DsMlaWrite: cache is null");
  DCP_CHECK_ARG(p.kv_c_row_stride >= fp8_ds_mla::kLatentDim || p.num_rows == 1,
                "Fp8DsMlaWrite: kv_c_row_stride %d < %d", p.kv_c_row_stride,
                fp8_ds_mla::kLatentDim);
  DCP_CHECK_ARG(p.k_pe_row_stride >= fp8_ds_mla::kRopeDim || p.num_rows == 1,
                "Fp8DsMlaWrite: k_pe_row_stride %d < %d", p.k_pe_row_stride,
                fp8_ds_mla::kRopeDim);
  return absl::OkStatus();
}

inline absl::Status CheckFp8DsMlaGather(const Fp8DsMlaGatherParams& p) {
  DCP_CHECK_ARG(p.num_rows >= 0 && p.num_src_rows >= 0,
                "Fp8DsMlaGather: num_rows %d and num_src_rows %d must be >= 0", p.num_rows,
                p.num_src_rows);
  DCP_CHECK_ARG(p.cache_row_bytes == fp8_ds_mla::kRowBytes,
                "Fp8DsMlaGather: fp8_ds_mla rows are %d bytes, got a cache row stride of %d bytes",
                fp8_ds_mla::kRowBytes, p.cache_row_bytes);
  DCP_CHECK_ARG(p.dst_dtype == DType::kF32 || p.dst_dtype == DType::kBF16,
                "Fp8DsMlaGather: output dtype %s is not F32 or BF16", dtype_name(p.dst_dtype));
  if (p.num_rows == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.index != nullptr && p.dst != nullptr,
                "Fp8DsMlaGather: index and dst must not be null");
  DCP_CHECK_ARG(p.num_src_rows == 0 || p.cache != nullptr, "Fp8DsMlaGather: cache is null");
  DCP_CHECK_ARG(p.dst_row_stride >= fp8_ds_mla::kRowWidth || p.num_rows == 1,
                "Fp8DsMlaGather: dst_row_stride %d < %d", p.dst_row_stride,
                fp8_ds_mla::kRowWidth);
  return absl::OkStatus();
}

}  // namespace dcp
