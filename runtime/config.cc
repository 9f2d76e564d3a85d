#include "runtime/config.h"

#include <cmath>
#include <cstring>

#include "attention/attention_params.h"
#include "core/message_hash.h"
#include "core/status.h"

namespace dcp {

ModelDims ModelDims::DeepSeekV32() {
  ModelDims dims;
  dims.num_heads = 128;
  dims.kv_lora_rank = 512;
  dims.qk_nope_head_dim = 128;
  dims.qk_rope_head_dim = 64;
  dims.v_head_dim = 128;
  return dims;
}

ModelDims ModelDims::Glm5() {
  ModelDims dims;
  dims.num_heads = 64;
  dims.kv_lora_rank = 512;
  dims.qk_nope_head_dim = 192;
  dims.qk_rope_head_dim = 64;
  dims.v_head_dim = 256;
  return dims;
}

float ModelDims::scale() const {
  if (softmax_scale != 0.0f) return softmax_scale;
  return 1.0f / std::sqrt(static_cast<float>(qk_head_dim()));
}

absl::Status ModelDims::Validate() const {
  DCP_CHECK_ARG(num_heads > 0, "model.num_heads must be positive, got %d", num_heads);
  DCP_CHECK_ARG(kv_lora_rank > 0, "model.kv_lora_rank must be positive, got %d", kv_lora_rank);
  DCP_CHECK_ARG(qk_nope_head_dim > 0, "model.qk_nope_head_dim must be positive, got %d",
                qk_nope_head_dim);
  DCP_CHECK_ARG(qk_rope_head_dim >= 0, "model.qk_rope_head_dim must be >= 0, got %d",
                qk_rope_head_dim);
  DCP_CHECK_ARG(v_head_dim > 0, "model.v_head_dim must be positive, got %d", v_head_dim);
  DCP_CHECK_ARG(std::isfinite(softmax_scale) && softmax_scale >= 0.0f,
                "model.softmax_scale must be finite and >= 0 (0 = default), got %g",
                softmax_scale);
  return absl::OkStatus();
}

const char* combine_backend_name(CombineBackend backend) {
  return backend == CombineBackend::kAllToAll ? "a2a" : "ag_rs";
}

absl::Status ParseCombineBackend(const std::string& text, CombineBackend* backend) {
  if (text == "ag_rs") {
    *backend = CombineBackend::kAllGatherReduceScatter;
  } else if (text == "a2a") {
    *backend = CombineBackend::kAllToAll;
  } else {
    return DCP_ERROR(InvalidArgument, "dcp.combine must be ag_rs or a2a, got '%s'", text);
  }
  return absl::OkStatus();
}

absl::Status DcpConfig::Validate() const {
  DCP_CHECK_ARG(world_size > 0, "dcp.world_size must be positive, got %d", world_size);
  DCP_CHECK_ARG(rank >= 0 && rank < world_size, "dcp.rank must be in [0, %d), got %d",
                world_size, rank);
  DCP_CHECK_ARG(interleave > 0, "dcp.interleave must be positive, got %d", interleave);
  DCP_CHECK_ARG(comm_timeout_s > 0, "dcp.comm_timeout_s must be positive, got %g",
                comm_timeout_s);
  return absl::OkStatus();
}

absl::Status SchedulerConfig::Validate() const {
  DCP_CHECK_ARG(max_num_seqs > 0, "scheduler.max_num_seqs must be positive, got %d",
                max_num_seqs);
  DCP_CHECK_ARG(max_model_len > 0, "scheduler.max_model_len must be positive, got %d",
                max_model_len);
  DCP_CHECK_ARG(block_size > 0, "scheduler.block_size must be positive, got %d", block_size);
  DCP_CHECK_ARG(decode_threshold >= 1, "scheduler.decode_threshold must be >= 1, got %d",
                decode_threshold);
  DCP_CHECK_ARG(num_kv_blocks >= 0, "scheduler.num_kv_blocks must be >= 0, got %d",
                num_kv_blocks);
  return absl::OkStatus();
}

absl::Status AttentionConfig::Validate() const {
  DCP_CHECK_ARG(index_topk > 0, "attention.index_topk must be positive, got %d", index_topk);
  // A step planned without a top-k selects every causal position of requests up to index_topk
  // long: that width, too, the kernels take up to kMaxTopkWidth only.
  DCP_CHECK_ARG(index_topk <= kMaxTopkWidth, "attention.index_topk %d is above the limit %d",
                index_topk, kMaxTopkWidth);
  DCP_CHECK_ARG(!prefill_backend.empty(), "attention.prefill_backend must not be empty "
                "(auto, none or a backend name)");
  DCP_RETURN_IF_ERROR(CheckKvCacheDTypeSupported(kv_cache_dtype, "attention.kv_cache_dtype"));
  return absl::OkStatus();
}

uint64_t SettingsFingerprint(const DcpOptions& o) {
  MessageHash64 hash;  // a word a setting (value() mixes in the count)
  const auto put = [&hash](uint64_t word) { hash.AddWord(word); };
  const ModelDims& m = o.model;
  for (const int v :
       {m.num_heads, m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim,
        o.dcp.world_size, o.dcp.interleave, static_cast<int>(o.dcp.combine),
        o.scheduler.max_num_seqs, o.scheduler.max_model_len, o.scheduler.block_size,
        o.scheduler.decode_threshold, o.attention.index_topk, o.attention.is_sparse ? 1 : 0,
        o.attention.force_mqa ? 1 : 0, static_cast<int>(o.attention.kv_cache_dtype)}) {
    put(static_cast<uint64_t>(static_cast<int64_t>(v)));
  }
  uint32_t scale_bits = 0;
  const float scale = m.scale();
  std::memcpy(&scale_bits, &scale, sizeof(scale_bits));
  put(scale_bits);
  put(static_cast<uint64_t>(o.workspace_rows_override));
  for (const char c : o.attention.prefill_backend) put(static_cast<unsigned char>(c));
  return hash.value();
}

absl::Status ValidateConfigs(const ModelDims& model, const DcpConfig& dcp,
                             const SchedulerConfig& scheduler, const AttentionConfig& attention) {
  DCP_RETURN_IF_ERROR(model.Validate());
  DCP_RETURN_IF_ERROR(dcp.Validate());
  DCP_RETURN_IF_ERROR(scheduler.Validate());
  DCP_RETURN_IF_ERROR(attention.Validate());
  DCP_CHECK_ARG(model.num_heads % dcp.world_size == 0,
                "model.num_heads (%d) must be divisible by dcp.world_size (%d)", model.num_heads,
                dcp.world_size);
  DCP_CHECK_ARG(scheduler.block_size % dcp.interleave == 0,
                "dcp.interleave (%d) must divide scheduler.block_size (%d)", dcp.interleave,
                scheduler.block_size);
  if (attention.kv_cache_dtype == KvCacheDType::kFp8DsMla) {
    DCP_CHECK_ARG(model.kv_lora_rank == fp8_ds_mla::kLatentDim &&
                      model.qk_rope_head_dim == fp8_ds_mla::kRopeDim,
                  "attention.kv_cache_dtype fp8_ds_mla needs kv_lora_rank %d and "
                  "qk_rope_head_dim %d (DeepSeek's 656-byte rows), got %d and %d",
                  fp8_ds_mla::kLatentDim, fp8_ds_mla::kRopeDim, model.kv_lora_rank,
                  model.qk_rope_head_dim);
  }
  return absl::OkStatus();
}

}  // namespace dcp
