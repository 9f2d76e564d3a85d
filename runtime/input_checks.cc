#include "runtime/input_checks.h"

#include "attention/attention_params.h"
#include "core/status.h"

namespace dcp {

std::string ShapeString(const std::vector<int64_t>& shape) {
  std::string text = "[";
  for (size_t i = 0; i < shape.size(); ++i) text += (i ? ", " : "") + std::to_string(shape[i]);
  return text + "]";
}

absl::Status CheckView(const char* name, const void* data, DType dtype, MemorySpace memory,
                       const std::vector<int64_t>& shape, const std::vector<int64_t>& expected,
                       bool float_dtype, MemorySpace device_memory) {
  if (shape != expected) {
    return DCP_ERROR(InvalidArgument, "%s has shape %s, expected %s", name, ShapeString(shape),
                     ShapeString(expected));
  }
  if (float_dtype) {
    DCP_CHECK_ARG(dtype == DType::kF32 || dtype == DType::kBF16, "%s must be F32 or BF16, got %s",
                  name, dtype_name(dtype));
  } else {
    DCP_CHECK_ARG(dtype == DType::kI32, "%s must be I32, got %s", name, dtype_name(dtype));
  }
  DCP_CHECK_ARG(memory == MemorySpace::kHost || memory == device_memory,
                "%s is device memory but this rank's device works on host memory", name);
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  DCP_CHECK_ARG(count == 0 || data != nullptr, "%s has no data pointer", name);
  return absl::OkStatus();
}

absl::Status CheckLengthsWithoutTopk(absl::Span<const BatchRequest> batch, int index_topk) {
  for (const BatchRequest& r : batch) {
    DCP_CHECK_ARG(r.seq_len <= index_topk,
                  "no top-k indices were given, so every causal key is selected, but request "
                  "id %d has seq_len %d > index_topk %d",
                  r.request_id, r.seq_len, index_topk);
  }
  return absl::OkStatus();
}

absl::Status CheckLayerInputs(const LayerInputShape& shape, absl::Span<const BatchRequest> batch,
                              const BatchInputs& inputs, const BatchOutputs& outputs) {
  const ModelDims& m = *shape.model;
  const int64_t hl = shape.heads, width = m.latent_width();
  const MemorySpace memory = shape.device_memory;
  int64_t num_tokens = 0;
  for (const BatchRequest& r : batch) num_tokens += r.query_len;
  DCP_RETURN_IF_ERROR(
      CheckView("q_nope", inputs.q_nope, {num_tokens, hl, m.qk_nope_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(
      CheckView("q_rope", inputs.q_rope, {num_tokens, hl, m.qk_rope_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("kv_new", inputs.kv_new, {num_tokens, width}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("out", outputs.out.data, outputs.out.dtype, outputs.out.memory,
                                outputs.out.shape, {num_tokens, hl, m.v_head_dim}, true, memory));
  DCP_RETURN_IF_ERROR(CheckView("lse", outputs.lse.data, outputs.lse.dtype, outputs.lse.memory,
                                outputs.lse.shape, {num_tokens, hl}, true, memory));
  DCP_CHECK_ARG(outputs.lse.dtype == DType::kF32, "lse must be F32, got %s",
                dtype_name(outputs.lse.dtype));

  if (inputs.topk.shape.empty()) return CheckLengthsWithoutTopk(batch, shape.index_topk);
  // The width is the indexer's (usually index_topk); -1 pads rows that select fewer keys.
  DCP_CHECK_ARG(inputs.topk.shape.size() == 2 && inputs.topk.shape[0] == num_tokens &&
                    inputs.topk.shape[1] >= 1 && inputs.topk.shape[1] <= kMaxTopkWidth,
                "topk has shape %s, expected [%d, K] with 1 <= K <= 2^20",
                ShapeString(inputs.topk.shape), num_tokens);
  return CheckView("topk", inputs.topk, inputs.topk.shape, false, memory);
}

}  // namespace dcp
