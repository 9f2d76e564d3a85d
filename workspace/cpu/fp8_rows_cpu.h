// CPU fp8_ds_mla cache write and gather (workspace/fp8_rows_params.h): the quantizing cache
// write of CPU ranks (float32 input; BF16 accepted too) and the workspace gather that
// dequantizes cached rows into the up-projection's input type (F32 or BF16). Bit-exact with the
// format of core/kv_cache_format.h.
#pragma once

#include "absl/status/status.h"
#include "workspace/fp8_rows_params.h"

namespace dcp::cpu {

absl::Status WriteFp8DsMlaRows(const Fp8DsMlaWriteParams& params);
absl::Status GatherFp8DsMlaRows(const Fp8DsMlaGatherParams& params);

}  // namespace dcp::cpu
