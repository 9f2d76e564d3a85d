// What the layer-level multi-rank tests share (worker_multirank_test,
// engine_workload_multirank_test): values as pure functions of (seed, tensor, index), the model dims
// per device, the rank's device and data-plane communicator, the comparison of one rank's heads
// against the float64 reference, and the fixture that skips a CUDA run on a machine without a GPU
// (or fails it with DCP_REQUIRE_GPU=1).
#pragma once

#include <cstdint>
#include <memory>

#include "absl/status/statusor.h"
#include "absl/types/span.h"
#include "collectives/communicator.h"
#include "collectives/mpi_communicator.h"
#include "runtime/config.h"
#include "runtime/device.h"
#include "tests/multirank/multirank_test.h"
#include "tests/reference/mla_reference.h"

namespace dcp::testing {

// SplitMix64's finalizer.
uint64_t Mix(uint64_t x);

// Uniform in [-scale, scale), a pure function of (seed, tensor, index).
float Value(uint64_t seed, int tensor, int64_t index, float scale);

// DCP_TEST_DEVICE=cuda runs the tests on CUDA ranks (bf16 storage; ranks may share a GPU, then
// the communicator is MPI with host staging). Default: CPU ranks, fp32.
bool UseCuda();

// DCP_REQUIRE_GPU=1 (the GPU machine's run): a skip is a failure, and cuDNN must be there too.
bool GpuRequiredHere();

struct Dims {
  int heads = 12, r = 32, dn = 16, dr = 8, dv = 16;
};

// Small dims on CPU ranks; DeepSeek's head sizes (qk 192 / v 128, latent 576 / 512) on CUDA
// ranks, the sizes the CUDA kernels are compiled for.
Dims TestDims(int heads);

// Options with the model's dims, this rank's place in a world of `world`, and a 60 s
// collective timeout; the rest at their defaults.
DcpOptions RankOptions(const Dims& d, int world, int rank);

// fp32 storage on CPU ranks; bf16 storage (inputs, cache, projected K/V rounded) on CUDA ranks.
double Tolerance();

// This rank's device and the communicator its data plane runs on: a CPU device over `mpi`, or
// (DCP_TEST_DEVICE=cuda) a GPU and the CUDA communicator the factory picks.
struct RankDevice {
  std::unique_ptr<Device> device;
  std::unique_ptr<Communicator> owned_comm;
  Communicator* comm = nullptr;
};
absl::StatusOr<RankDevice> MakeRankDevice(MpiCommunicator& mpi);

// RMS of v[h][j] = w_uv[h]^T kv_c[j] over every head and (up to 64 of) the kv rows.
double ValueRms(const reference::MlaProblem& whole, const Dims& d);

// Every value of this rank's heads (out [T, H/W, Dv], lse [T, H/W], tokens in the problem's
// order) against the float64 reference of the whole problem; NaN never passes. The output
// tolerance is relative to ValueRms: with bf16 storage (CUDA ranks: K/V, q' and the softmax
// weights rounded) a softmax weight carries an error of order 1e-2 that multiplies whole values,
// whatever the size of the (cancelling) average. A wrong key set, merge or combine moves outputs
// by O(v). `bf16_out`: the outputs were rounded to bf16 once more (half a unit in the last place).
void ExpectRankOutputsMatch(absl::Span<const float> out, absl::Span<const float> lse, bool bf16_out,
                            const reference::MlaProblem& whole, const reference::MlaResult& ref,
                            const Dims& d, int world, int rank);

// The fixture of the layer tests: skips (or, with DCP_REQUIRE_GPU=1, fails) a CUDA run on a
// machine without a GPU; SharedSeed gives every rank rank 0's random seed.
class LayerRankTest : public MultiRankTest {
 protected:
  void SetUp() override;
  uint64_t SharedSeed();
};

}  // namespace dcp::testing
