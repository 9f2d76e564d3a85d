#include "runtime/dcp.h"

#include "runtime/worker.h"

namespace dcp {
DcpContext::DcpContext(std::unique_ptr<Worker> worker) : worker_(std::move(worker)) {}
DcpContext::~DcpContext() = default;

absl::StatusOr<std::unique_ptr<DcpContext>> DcpContext::Create(const DcpOptions& options,
                                                               Communicator& comm,
                                                               Device& device,
                                                               const LayerWeights& weights) {
  absl::StatusOr<std::unique_ptr<Worker>> worker = Worker::Create(options, comm, device, weights);
  // Start-up is collective too: a rank with a bad config or too little memory fails everyone.
  if (absl::Status shared = AgreeOnStatus(comm, worker.status()); !shared.ok()) return shared;
  return std::unique_ptr<DcpContext>(new DcpContext(std::move(worker).value()));
}

absl::Status DcpContext::AddRequest(int64_t request_id) {
  return AgreeOnStatus(worker_->comm(), worker_->AddRequest(request_id));
}
absl::Status DcpContext::FreeRequest(int64_t request_id) {
  return AgreeOnStatus(worker_->comm(), worker_->FreeRequest(request_id));
}
absl::Status DcpContext::TruncateRequest(int64_t request_id, int64_t num_tokens) {
  return AgreeOnStatus(worker_->comm(), worker_->TruncateRequest(request_id, num_tokens));
}
absl::Status DcpContext::ForkRequest(int64_t request_id, int64_t from_id, int64_t num_tokens) {
  return AgreeOnStatus(worker_->comm(), worker_->ForkRequest(request_id, from_id, num_tokens));
}
absl::Status DcpContext::LoadCachedKv(int64_t request_id, int64_t num_tokens,
                                      const TensorView& local_rows) {
  return AgreeOnStatus(worker_->comm(), worker_->LoadCachedKv(request_id, num_tokens, local_rows));
}
absl::Status DcpContext::AddRequests(absl::Span<const int64_t> request_ids) {
  absl::Status local = absl::OkStatus();
  for (size_t i = 0; i < request_ids.size() && local.ok(); ++i) {
    local = worker_->AddRequest(request_ids[i]);
  }
  return AgreeOnStatus(worker_->comm(), local);
}
absl::Status DcpContext::FreeRequests(absl::Span<const int64_t> request_ids) {
  absl::Status local = absl::OkStatus();
  for (size_t i = 0; i < request_ids.size() && local.ok(); ++i) {
    local = worker_->FreeRequest(request_ids[i]);
  }
  return AgreeOnStatus(worker_->comm(), local);
}
absl::Status DcpContext::LoadCachedKv(absl::Span<const CachedKv> requests) {
  absl::Status local = absl::OkStatus();
  for (size_t i = 0; i < requests.size() && local.ok(); ++i) {
    local = worker_->LoadCachedKv(requests[i].request_id, requests[i].num_tokens,
                                  requests[i].local_rows);
  }
  return AgreeOnStatus(worker_->comm(), local);
}
absl::Status DcpContext::Forward(absl::Span<const BatchRequest> batch, const BatchInputs& inputs,
                                 const BatchOutputs& outputs) {
  return worker_->Forward(batch, inputs, outputs);
}
absl::StatusOr<std::string> DcpContext::PlanJson(absl::Span<const BatchRequest> batch,
                                                 bool has_topk) {
  return worker_->PlanJson(batch, has_topk);
}
const ForwardStats& DcpContext::last_stats() const { return worker_->last_stats(); }
bool DcpContext::dense_mha_available() const { return worker_->dense_mha_available(); }
void DcpContext::DamageNextPlanForTesting() { worker_->DamageNextPlanForTesting(); }

}  // namespace dcp
