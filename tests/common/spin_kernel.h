// A kernel that holds a stream until the host sets a flag: the tests' way to make stream work
// that cannot complete (a collective queued behind it), then let it drain.
#pragma once

#include <cuda_runtime.h>

namespace dcp::testing {

// Spins on `flag` (host-mapped memory, device pointer) until it is non-zero, or `limit_s`
// seconds have passed (so a failing test never leaves the GPU busy for long).
cudaError_t LaunchSpinUntilSet(const int* flag, double limit_s, cudaStream_t stream);

}  // namespace dcp::testing
