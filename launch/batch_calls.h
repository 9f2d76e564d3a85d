// The DcpContext calls one batch takes, shared by the group's run and the single-rank
// reference: register the requests, place their cached rows, run the layer, free them.
// Each call is collective on the context's communicator (runtime/dcp.h) and agrees once for
// the whole batch, whatever its number of requests.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "launch/rank_batch.h"
#include "runtime/dcp.h"

namespace dcp::launch {

absl::Status AddRequests(DcpContext& context, const RankBatch& batch);
// Places every request's cached rows (replacing what a previous Forward appended).
absl::Status LoadContext(DcpContext& context, const RankBatch& batch, const ModelDims& model);
// One Forward; out [T, heads, Dv] and lse [T, heads] are resized and filled.
absl::Status ForwardBatch(DcpContext& context, const RankBatch& batch, const ModelDims& model,
                          int heads, std::vector<float>* out, std::vector<float>* lse);
absl::Status FreeRequests(DcpContext& context, const RankBatch& batch);

}  // namespace dcp::launch
