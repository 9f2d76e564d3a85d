#include "launch/batch_calls.h"

#include "core/status.h"

namespace dcp::launch {

namespace {
std::vector<int64_t> RequestIds(const RankBatch& batch) {
  std::vector<int64_t> ids;
  ids.reserve(batch.requests.size());
  for (const BatchRequest& request : batch.requests) ids.push_back(request.request_id);
  return ids;
}
}  // namespace

absl::Status AddRequests(DcpContext& context, const RankBatch& batch) {
  return context.AddRequests(RequestIds(batch));
}

absl::Status LoadContext(DcpContext& context, const RankBatch& batch, const ModelDims& model) {
  const int64_t width = model.latent_width();
  std::vector<CachedKv> cached(batch.requests.size());
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const BatchRequest& request = batch.requests[i];
    const std::vector<float>& rows = batch.cached_rows[i];
    cached[i] = {request.request_id, request.seq_len - request.query_len,
                 TensorView{rows.data(), DType::kF32, {int64_t(rows.size()) / width, width}}};
  }
  return context.LoadCachedKv(cached);
}

absl::Status ForwardBatch(DcpContext& context, const RankBatch& batch, const ModelDims& model,
                          int heads, std::vector<float>* out, std::vector<float>* lse) {
  const int64_t tokens = batch.num_tokens();
  out->assign(size_t(tokens * heads * model.v_head_dim), 0.0f);
  lse->assign(size_t(tokens * heads), 0.0f);
  BatchOutputs outputs;
  outputs.out = MutableTensorView{out->data(), DType::kF32, {tokens, heads, model.v_head_dim}};
  outputs.lse = MutableTensorView{lse->data(), DType::kF32, {tokens, heads}};
  return context.Forward(batch.requests, InputViews(batch, model, heads), outputs);
}

absl::Status FreeRequests(DcpContext& context, const RankBatch& batch) {
  return context.FreeRequests(RequestIds(batch));
}

}  // namespace dcp::launch
