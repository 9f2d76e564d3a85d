// The configuration of one DCP group: model dimensions, the group itself, the scheduler's
// limits and the attention options. Every struct validates itself with a clear message that
// names the offending field; nothing downstream re-checks these invariants.
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "core/kv_cache_format.h"

namespace dcp {

// DESIGN.md section 2. DeepSeek-V3.2: H 128, R 512, Dn 128, Dr 64, Dv 128.
struct ModelDims {
  int num_heads = 16;          // H: query heads of the whole DCP group
  int kv_lora_rank = 64;       // R: latent width of kv_c
  int qk_nope_head_dim = 32;   // Dn
  int qk_rope_head_dim = 16;   // Dr
  int v_head_dim = 32;         // Dv
  float softmax_scale = 0.0f;  // 0 = 1/sqrt(Dn + Dr)

  static ModelDims DeepSeekV32();
  // GLM-5: 64 heads, R 512, Dn 192, Dr 64, Dv 256 (qk 256 / v 256 per head).
  static ModelDims Glm5();
  int latent_width() const { return kv_lora_rank + qk_rope_head_dim; }  // R + Dr (576)
  int qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }  // Dn + Dr (192)
  float scale() const;
  absl::Status Validate() const;
};

enum class CombineBackend { kAllGatherReduceScatter, kAllToAll };  // ag_rs, a2a
const char* combine_backend_name(CombineBackend backend);
absl::Status ParseCombineBackend(const std::string& text, CombineBackend* backend);

struct DcpConfig {
  int world_size = 1;  // W
  int rank = 0;
  int interleave = 1;  // I: cp_kv_cache_interleave_size; divides the block size
  CombineBackend combine = CombineBackend::kAllGatherReduceScatter;
  double comm_timeout_s = 300.0;  // a collective stuck longer than this is an error

  absl::Status Validate() const;
};

struct SchedulerConfig {
  int max_num_seqs = 64;        // N
  int max_model_len = 4096;     // M
  int block_size = 64;          // B
  int decode_threshold = 1;     // query_len <= this is a decode
  int num_kv_blocks = 0;        // per-rank KV block pool; 0 = enough for N full sequences

  absl::Status Validate() const;
};

struct AttentionConfig {
  int index_topk = 2048;              // K
  bool is_sparse = true;
  bool force_mqa = false;
  // Check the given top-k on the device every Forward, the rows the step reads (DESIGN.md
  // section 3; dense-route prefills read none: TopkRowsRead), each rank its share of them. An
  // engine that trusts its indexer may turn it off: the kernels never read memory through a bad
  // index anyway (TopkToSlots drops positions past the token's own or outside the block table),
  // but a bad row then silently attends over fewer keys.
  bool validate_topk = true;
  std::string prefill_backend = "auto";  // auto | none | native | cudnn
  // Row format of the KV cache (FORMATS.md): bf16 rows of the storage dtype, or vLLM's 656-byte
  // fp8_ds_mla rows (R = 512, Dr = 64 only, checked by ValidateConfigs).
  KvCacheDType kv_cache_dtype = KvCacheDType::kBF16;

  absl::Status Validate() const;
};

// Every cross-struct rule: H % W, I divides B, ... Call before building anything.
absl::Status ValidateConfigs(const ModelDims& model, const DcpConfig& dcp,
                             const SchedulerConfig& scheduler, const AttentionConfig& attention);

// Everything a DcpContext or DcpEngine is created from.
struct DcpOptions;
// A hash of every option the ranks of a group must share (model dimensions and scale, W and the
// interleave, the combine, the scheduler's limits and decode threshold, the attention options,
// the KV cache format, the workspace override); per-rank fields (rank, timeouts, block pool)
// are left out. Carried in every plan (Plan::settings), so ranks created with different
// options fail their first Plan instead of computing over different layouts.
uint64_t SettingsFingerprint(const DcpOptions& options);

struct DcpOptions {
  ModelDims model;
  DcpConfig dcp;  // world_size and rank must match the communicator's
  SchedulerConfig scheduler;
  AttentionConfig attention;
  // Rows S of the chunked-prefill workspace; 0 = the seed's formula (DESIGN.md section 6).
  // Rounded up to lcm(B, W*I). For tests that force several chunks, and for tuning.
  int64_t workspace_rows_override = 0;
};

}  // namespace dcp
