// The fp8_ds_mla cache write and gather on a bench rank's Device: the CUDA launchers on the
// device's stream for a CudaDevice, the CPU functions otherwise. The Device interface does not
// carry these kernels yet (the runtime wiring of the FP8 cache comes later); the bench rows
// that compare FP8 with bf16 rows call them through here.
#pragma once

#include "absl/status/status.h"
#include "runtime/device.h"
#include "workspace/fp8_rows_params.h"

namespace dcp::bench {

absl::Status WriteFp8DsMlaRowsOn(Device& device, const Fp8DsMlaWriteParams& params);
absl::Status GatherFp8DsMlaRowsOn(Device& device, const Fp8DsMlaGatherParams& params);

}  // namespace dcp::bench
