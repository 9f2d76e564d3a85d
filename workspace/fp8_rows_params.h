// Parameters of the kernels that write and read fp8_ds_mla cache rows (core/kv_cache_format.h
// has the 656-byte layout). Flat POD structs like workspace_params.h: pointers are host memory for
// the CPU functions (workspace/cpu/fp8_rows_cpu.h) and device memory for the CUDA launchers
// (workspace/cuda/fp8_rows_cuda.h), index arrays included.
#pragma once

#include <cstdint>

#include "core/dtype.h"

namespace dcp {

// The cache write that quantizes: for i in [0, num_rows) with slot = slot_mapping[i] in
// [0, num_slots), cache row `slot` = fp8_ds_mla(kv_c[i], k_pe[i]); a slot of -1 (a token another
// rank owns) or outside [0, num_slots) is skipped. Slots must be distinct. The whole row is
// written (quantized kv_c, the 4 scales, k_pe as bf16).
struct Fp8DsMlaWriteParams {
  const void* kv_c = nullptr;           // [num_rows, 512] of dtype, row stride kv_c_row_stride
  const void* k_pe = nullptr;           // [num_rows, 64] of dtype, row stride k_pe_row_stride
  const int32_t* slot_mapping = nullptr;  // [num_rows]
  uint8_t* cache = nullptr;             // [num_slots, 656] bytes, row stride cache_row_bytes
  DType dtype = DType::kBF16;           // of kv_c and k_pe: BF16 (CUDA), F32 or BF16 (CPU)
  int64_t num_rows = 0, num_slots = 0;
  int64_t kv_c_row_stride = 0, k_pe_row_stride = 0;  // elements
  int64_t cache_row_bytes = 656;                      // must be 656
};

// The workspace gather that dequantizes: dst[i] = [kv_c | k_pe] of cache row index[i] as 576
// values of dst_dtype (kv_c = e4m3 * s_t in float32, then rounded to dst_dtype; k_pe converted
// from bf16). An index of -1 or outside [0, num_src_rows) writes a zero row and reads nothing.
struct Fp8DsMlaGatherParams {
  const uint8_t* cache = nullptr;  // [num_src_rows, 656] bytes, row stride cache_row_bytes
  const int32_t* index = nullptr;  // [num_rows]
  void* dst = nullptr;             // [num_rows, 576] of dst_dtype, row stride dst_row_stride
  DType dst_dtype = DType::kBF16;  // BF16 (CUDA), F32 or BF16 (CPU)
  int64_t num_rows = 0, num_src_rows = 0;
  int64_t cache_row_bytes = 656;   // must be 656
  int64_t dst_row_stride = 576;    // elements, >= 576
};

}  // namespace dcp
