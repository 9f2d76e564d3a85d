#include "launch/limits.h"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>

#include "absl/strings/str_format.h"
#include "core/kv_layout.h"
#include "core/status.h"
#include "workspace/workspace_size.h"

namespace dcp::launch {
namespace {

absl::Status Ceiling(const char* key, int64_t value, int64_t ceiling) {
  if (value <= ceiling) return absl::OkStatus();
  return DCP_ERROR(InvalidArgument, "%s = %d exceeds its ceiling of %d (docs/hardening.md)", key,
                   value, ceiling);
}

std::string GiB(int64_t bytes) { return absl::StrFormat("%.2f GiB", double(bytes) / (1 << 30)); }

}  // namespace

absl::Status CheckCeilings(const RunConfig& config,
                           const std::vector<std::vector<RequestShape>>& batches) {
  const ModelDims& m = config.model;
  DCP_RETURN_IF_ERROR(Ceiling("model.num_heads", m.num_heads, kMaxHeads));
  DCP_RETURN_IF_ERROR(Ceiling("model.kv_lora_rank", m.kv_lora_rank, kMaxHeadDim));
  DCP_RETURN_IF_ERROR(Ceiling("model.qk_nope_head_dim", m.qk_nope_head_dim, kMaxHeadDim));
  DCP_RETURN_IF_ERROR(Ceiling("model.qk_rope_head_dim", m.qk_rope_head_dim, kMaxHeadDim));
  DCP_RETURN_IF_ERROR(Ceiling("model.v_head_dim", m.v_head_dim, kMaxHeadDim));
  const SchedulerConfig& s = config.scheduler;
  DCP_RETURN_IF_ERROR(Ceiling("scheduler.max_model_len", s.max_model_len, kMaxModelLen));
  DCP_RETURN_IF_ERROR(Ceiling("scheduler.max_num_seqs", s.max_num_seqs, kMaxNumSeqs));
  DCP_RETURN_IF_ERROR(Ceiling("scheduler.num_kv_blocks", s.num_kv_blocks, kMaxKvBlocks));
  DCP_RETURN_IF_ERROR(Ceiling("scheduler.block_size", s.block_size, kMaxBlockSize));
  DCP_RETURN_IF_ERROR(Ceiling("scheduler.workspace_rows", config.workspace_rows,
                              kMaxWorkspaceRows));
  DCP_RETURN_IF_ERROR(Ceiling("attention.index_topk", config.attention.index_topk,
                              kMaxIndexTopk));
  const double timeout = config.dcp.comm_timeout_s;
  DCP_CHECK_ARG(std::isfinite(timeout) && timeout >= kMinCommTimeoutS &&
                    timeout <= kMaxCommTimeoutS,
                "dcp.comm_timeout_s (--comm-timeout) = %g s is outside [%g, %g] s: the minimum "
                "is %g s (a collective of a whole layer needs that much), the maximum a day",
                timeout, kMinCommTimeoutS, kMaxCommTimeoutS, kMinCommTimeoutS);
  DCP_RETURN_IF_ERROR(Ceiling("the number of batches", int64_t(batches.size()), kMaxBatches));
  for (const std::vector<RequestShape>& batch : batches) {
    int64_t tokens = 0;
    for (const RequestShape& r : batch) {
      tokens += r.query_len;
      DCP_RETURN_IF_ERROR(Ceiling("a request's seq_len", r.seq_len, kMaxModelLen));
    }
    DCP_RETURN_IF_ERROR(Ceiling("requests in one batch", int64_t(batch.size()), kMaxNumSeqs));
    DCP_RETURN_IF_ERROR(Ceiling("query tokens in one batch", tokens, kMaxBatchTokens));
  }
  return absl::OkStatus();
}

int64_t MemoryEstimate::host_total() const {
  return (device_is_host ? kv_cache + workspace : 0) + batch + reference + results;
}

std::string MemoryEstimate::ToString() const {
  return absl::StrFormat("KV cache %s, workspace %s, batch inputs %s, --check reference %s, "
                         "gathered results %s",
                         GiB(kv_cache), GiB(workspace), GiB(batch), GiB(reference), GiB(results));
}

MemoryEstimate EstimateRankMemory(const RunConfig& config,
                                  const std::vector<std::vector<RequestShape>>& batches,
                                  int64_t problem_bytes) {
  const ModelDims& m = config.model;
  const SchedulerConfig& s = config.scheduler;
  const int world = std::max(1, config.dcp.world_size);
  const bool root = config.dcp.rank == 0;
  const int64_t width = m.latent_width();
  const int64_t element = config.run.device == "cuda" ? 2 : 4;  // BF16 on CUDA ranks, else F32
  MemoryEstimate e;
  e.device_is_host = config.run.device != "cuda";

  // The worker's own formulas (runtime/worker.cc): N full sequences of KV unless configured.
  const KvLayout layout{world, config.dcp.interleave};
  // pools: how many ranks' configured pools the cache holds (the --check reference's world of
  // one holds all W: launch/check.cc, Reference::Create).
  const auto cache_bytes = [&](const KvLayout& l, int64_t element_bytes, int64_t pools = 1) {
    int64_t blocks = s.num_kv_blocks * pools;
    if (blocks == 0) {
      blocks = (l.local_length(s.max_model_len, 0) + s.block_size - 1) / s.block_size *
               int64_t(s.max_num_seqs);
    }
    return blocks * s.block_size * width * element_bytes;
  };
  e.kv_cache = cache_bytes(layout, element);
  const auto workspace = ComputeWorkspaceSize({s.block_size, s.max_num_seqs, s.max_model_len,
                                               config.attention.index_topk, world,
                                               config.dcp.interleave, int(width),
                                               config.workspace_rows});
  // None without a dense route (prefill_backend none: the engine allocates no workspace).
  if (workspace.ok() && config.attention.prefill_backend != "none") {
    // The workspace, the reorganized rows and the up-projected K/V of one chunk.
    e.workspace = workspace->total_rows * width * element +
                  workspace->rows_per_chunk *
                      (width + int64_t(m.num_heads / world) * (m.qk_head_dim() + m.v_head_dim)) *
                      element;
  }

  // The largest batch: this rank's queries, every new token's KV row, the top-k rows, its
  // cached rows, and out/lse; rank 0 gathers every head's out/lse.
  const int64_t heads = m.num_heads / world;
  int64_t largest = 0, largest_whole = 0, largest_results = 0;
  for (const std::vector<RequestShape>& batch : batches) {
    int64_t tokens = 0, rows = 0;
    for (const RequestShape& r : batch) {
      tokens += r.query_len;
      rows += r.seq_len;
    }
    const int64_t topk = tokens * config.attention.index_topk * 4;
    const int64_t per_rank = tokens * heads * (m.qk_head_dim() + m.v_head_dim + 1) * 4 +
                             tokens * width * 4 + topk + (rows / world + 1) * width * 4;
    const int64_t whole = tokens * m.num_heads * (m.qk_head_dim() + m.v_head_dim + 1) * 4 +
                          tokens * width * 4 + topk + rows * width * 4;
    largest = std::max(largest, per_rank);
    largest_whole = std::max(largest_whole, whole);
    largest_results = std::max(largest_results, tokens * m.num_heads * (m.v_head_dim + 1) * 4);
  }
  e.batch = largest;
  if (root) {
    e.results = largest_results + problem_bytes;
    if (config.run.check) {
      // A world-of-one context on the CPU: the whole KV cache in F32, plus the whole batch.
      e.reference =
          cache_bytes(KvLayout{1, config.dcp.interleave}, 4, world) + largest_whole +
          2 * int64_t(m.num_heads) * m.kv_lora_rank * (m.qk_nope_head_dim + m.v_head_dim) * 4;
    }
  }
  return e;
}

int64_t AvailableHostMemory() {
  std::ifstream meminfo("/proc/meminfo");
  std::string line;
  while (std::getline(meminfo, line)) {
    int64_t kib = 0;
    if (std::sscanf(line.c_str(), "MemAvailable: %ld kB", &kib) == 1) return kib * 1024;
  }
  const long pages = ::sysconf(_SC_AVPHYS_PAGES), page = ::sysconf(_SC_PAGESIZE);
  return pages > 0 && page > 0 ? int64_t(pages) * page : INT64_MAX;
}

absl::Status CheckMemory(const MemoryEstimate& root, const MemoryEstimate& other,
                         int ranks_on_node, int64_t available) {
  const int ranks = std::max(1, ranks_on_node);
  const int64_t needed = root.host_total() + (ranks - 1) * other.host_total();
  if (needed <= available) return absl::OkStatus();
  return DCP_ERROR(ResourceExhausted,
                   "this run needs about %s of host memory on a node of %d rank(s) (rank 0: %s) "
                   "but %s is available: lower the batch, --index-topk, --max-model-len, "
                   "--max-num-seqs or --num-kv-blocks",
                   GiB(needed), ranks, root.ToString(), GiB(available));
}

}  // namespace dcp::launch
