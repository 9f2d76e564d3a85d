// Ceilings on every value that sizes memory, and an estimate of what one rank will allocate,
// checked before anything is allocated: a mistyped flag (`--index-topk 2147483647`) is a clear
// error naming the value and its ceiling, never tens of GiB requested from the machine.
// Both are bad input (InvalidArgument / ResourceExhausted: dcp_run exit 2).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "attention/attention_params.h"
#include "launch/batch_spec.h"
#include "launch/run_config.h"

namespace dcp::launch {

// Stated ceilings (docs/hardening.md). Each is far above any real deployment and far below
// what would overflow the int32/int64 arithmetic that sizes the buffers.
inline constexpr int64_t kMaxIndexTopk = kMaxTopkWidth;  // K (the worker's top-k width limit)
inline constexpr int64_t kMaxModelLen = 1 << 24;        // max_model_len, any seq_len
inline constexpr int64_t kMaxNumSeqs = 1 << 20;         // max_num_seqs, requests per batch
inline constexpr int64_t kMaxKvBlocks = 1 << 26;        // num_kv_blocks per rank
inline constexpr int64_t kMaxBlockSize = 1 << 16;       // block_size
inline constexpr int64_t kMaxWorkspaceRows = 1 << 26;   // workspace_rows
inline constexpr int64_t kMaxBatchTokens = 1 << 24;     // query tokens of one batch
inline constexpr int64_t kMaxBatches = 1 << 16;         // batches of one run
inline constexpr int64_t kMaxHeads = 1 << 12;           // num_heads
inline constexpr int64_t kMaxHeadDim = 1 << 14;         // kv_lora_rank and each head dim
// dcp.comm_timeout_s: a collective of a whole layer on CPU ranks takes longer than a
// millisecond; a timeout below this would fail healthy runs, one above a day hides a hang.
inline constexpr double kMinCommTimeoutS = 1.0;
inline constexpr double kMaxCommTimeoutS = 86400.0;

// Every ceiling above, over the config (model dims, scheduler, attention, timeout) and the
// batches; the first value past its ceiling is an InvalidArgument naming key and ceiling.
absl::Status CheckCeilings(const RunConfig& config,
                           const std::vector<std::vector<RequestShape>>& batches);

// What one rank allocates for this run, by part (bytes).
struct MemoryEstimate {
  int64_t kv_cache = 0, workspace = 0, batch = 0, reference = 0, results = 0;
  int64_t host_total() const;  // what lives in host memory on this rank's device kind
  bool device_is_host = true;
  int64_t total() const { return kv_cache + workspace + batch + reference + results; }
  std::string ToString() const;
};

// config must already hold world_size and rank (FitConfig); `problem_bytes`: rank 0's copy of
// a problem file (0 for synthetic batches).
MemoryEstimate EstimateRankMemory(const RunConfig& config,
                                  const std::vector<std::vector<RequestShape>>& batches,
                                  int64_t problem_bytes);

// Bytes of host memory available now (MemAvailable of /proc/meminfo; the physical pages
// sysconf reports where that file is missing).
int64_t AvailableHostMemory();

// ResourceExhausted when rank 0's estimate plus `ranks_on_node - 1` times another rank's
// exceeds `available` (as if rank 0 shared this node: the bound holds on every node).
absl::Status CheckMemory(const MemoryEstimate& root, const MemoryEstimate& other,
                         int ranks_on_node, int64_t available);

}  // namespace dcp::launch
