#include "launch/batch_calls.h"

#include "core/status.h"

namespace dcp::launch {

absl::Status AddRequests(DcpContext& context, const RankBatch& batch) {
  for (const BatchRequest& request : batch.requests) {
    DCP_RETURN_IF_ERROR(context.AddRequest(request.request_id));
  }
  return absl::OkStatus();
}

absl::Status LoadContext(DcpContext& context, const RankBatch& batch, const ModelDims& model) {
  const int64_t width = model.latent_width();
  for (size_t i = 0; i < batch.requests.size(); ++i) {
    const BatchRequest& request = batch.requests[i];
    const std::vector<float>& rows = batch.cached_rows[i];
    const TensorView view{rows.data(), DType::kF32, {int64_t(rows.size()) / width, width}};
    DCP_RETURN_IF_ERROR(
        context.LoadCachedKv(request.request_id, request.seq_len - request.query_len, view));
  }
  return absl::OkStatus();
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
  for (const BatchRequest& request : batch.requests) {
    DCP_RETURN_IF_ERROR(context.FreeRequest(request.request_id));
  }
  return absl::OkStatus();
}

}  // namespace dcp::launch
