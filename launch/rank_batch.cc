#include "launch/rank_batch.h"

namespace dcp::launch {

RankView RankView::Of(const ModelDims& model, int world_size, int interleave, int rank) {
  RankView view;
  view.layout = KvLayout{world_size, interleave};
  view.rank = rank;
  const int per_rank = model.num_heads / world_size;
  view.head_begin = rank * per_rank;
  view.head_end = view.head_begin + per_rank;
  return view;
}

int64_t RankBatch::num_tokens() const {
  int64_t tokens = 0;
  for (const BatchRequest& request : requests) tokens += request.query_len;
  return tokens;
}

LayerWeights WeightViews(const RankWeights& weights, const ModelDims& model, int num_heads) {
  LayerWeights views;
  views.w_uk = TensorView{
      weights.w_uk.data(), DType::kF32, {num_heads, model.qk_nope_head_dim, model.kv_lora_rank}};
  views.w_uv = TensorView{
      weights.w_uv.data(), DType::kF32, {num_heads, model.kv_lora_rank, model.v_head_dim}};
  return views;
}

BatchInputs InputViews(const RankBatch& batch, const ModelDims& model, int num_heads) {
  const int64_t tokens = batch.num_tokens();
  BatchInputs inputs;
  inputs.q_nope =
      TensorView{batch.q_nope.data(), DType::kF32, {tokens, num_heads, model.qk_nope_head_dim}};
  inputs.q_rope =
      TensorView{batch.q_rope.data(), DType::kF32, {tokens, num_heads, model.qk_rope_head_dim}};
  inputs.kv_new = TensorView{batch.kv_new.data(), DType::kF32, {tokens, model.latent_width()}};
  if (!batch.topk.empty()) {
    inputs.topk = TensorView{batch.topk.data(), DType::kI32, {tokens, batch.topk_width}};
  } else {
    inputs.topk = TensorView{nullptr, DType::kI32, {}};
  }
  return inputs;
}

std::vector<RequestShape> ShapesOf(const RankBatch& batch) {
  std::vector<RequestShape> shapes;
  shapes.reserve(batch.requests.size());
  for (const BatchRequest& r : batch.requests) shapes.push_back({r.seq_len, r.query_len});
  return shapes;
}

}  // namespace dcp::launch
