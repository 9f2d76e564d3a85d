// The peer our collectives are measured against in the same run: plain NCCL calls on a
// communicator of their own over the same ranks and GPU, on the same stream, with nothing
// around them (nccl-tests' calls: ncclAllGather, ncclReduceScatter, all-to-all as grouped
// ncclSend/ncclRecv). Enqueue only; completion is left to the stream.
#pragma once

#include <cstddef>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "collectives/communicator.h"
#include "launch/bench/bench_harness.h"

namespace dcp::bench {

class RawPeer {
 public:
  virtual ~RawPeer() = default;
  virtual std::string name() const = 0;
  // The shapes of Communicator's calls of the same name.
  virtual absl::Status AllGather(const void* send, void* recv, size_t count, DType dtype) = 0;
  virtual absl::Status ReduceScatterSum(const void* send, void* recv, size_t count,
                                        DType dtype) = 0;
  virtual absl::Status AllToAll(const void* send, void* recv, size_t count, DType dtype) = 0;
};

// Collective. The raw NCCL peer when env.comm is NCCL; null (no error) otherwise, or in a
// build without CUDA.
absl::StatusOr<std::unique_ptr<RawPeer>> MakeRawPeer(BenchEnv& env);

// The stream the device runs its work on (CudaDevice::stream()); null for the CPU device.
StreamHandle DeviceStream(BenchEnv& env);

}  // namespace dcp::bench
