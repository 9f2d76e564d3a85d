// The DcpContext calls over many requests (runtime/dcp.h: AddRequests, LoadCachedKv(span),
// FreeRequests) that the launcher makes once per batch, on a world of one: the same state as
// the single calls, and a failing request stops the batch with an error that names it.
#include "launch/batch_calls.h"

#include "collectives/local_communicator.h"
#include "gtest/gtest.h"
#include "launch/synthetic.h"

namespace dcp::launch {
namespace {

class BatchCallsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    options_.dcp.world_size = 1;
    options_.scheduler.max_num_seqs = 8;
    options_.scheduler.max_model_len = 256;
    options_.attention.index_topk = 64;
    device_ = MakeCpuDevice();
    const RankView view = RankView::Of(options_.model, 1, 1, 0);
    weights_ = synthetic_.Weights(view);
    auto context = DcpContext::Create(options_, comm_, *device_,
                                      WeightViews(weights_, options_.model, view.num_heads()));
    ASSERT_TRUE(context.ok()) << context.status();
    context_ = std::move(context).value();
  }

  DcpOptions options_;
  LocalCommunicator comm_;
  std::unique_ptr<Device> device_;
  SyntheticWorkload synthetic_{ModelDims{}, 64, 7};
  RankWeights weights_;
  std::unique_ptr<DcpContext> context_;
};

TEST_F(BatchCallsTest, ABatchRunsLikeTheSingleCalls) {
  const std::vector<RequestShape> shapes = {{40, 1}, {30, 30}, {50, 8}};
  const RankView view = RankView::Of(options_.model, 1, 1, 0);
  const RankBatch batch = synthetic_.Batch(shapes, 0, /*first_request_id=*/10, view);
  ASSERT_TRUE(AddRequests(*context_, batch).ok());
  ASSERT_TRUE(LoadContext(*context_, batch, options_.model).ok());
  std::vector<float> out, lse;
  ASSERT_TRUE(ForwardBatch(*context_, batch, options_.model, view.num_heads(), &out, &lse).ok());
  ASSERT_TRUE(FreeRequests(*context_, batch).ok());
  // Freed: the ids are free to register again, one by one.
  for (const BatchRequest& r : batch.requests) EXPECT_TRUE(context_->AddRequest(r.request_id).ok());
}

TEST_F(BatchCallsTest, TheFirstFailingRequestStopsTheBatch) {
  const std::vector<int64_t> ids = {1, 2, 2, 3};
  const absl::Status status = context_->AddRequests(ids);
  EXPECT_FALSE(status.ok());
  EXPECT_NE(status.message().find("2"), std::string::npos) << status;
  EXPECT_TRUE(context_->AddRequest(1).code() != absl::StatusCode::kOk);  // registered
  EXPECT_TRUE(context_->AddRequest(3).ok());                             // never reached
  const std::vector<int64_t> unknown = {1, 99};
  EXPECT_FALSE(context_->FreeRequests(unknown).ok());
  const std::vector<CachedKv> too_long = {{3, 100000, TensorView{}}};
  EXPECT_EQ(context_->LoadCachedKv(too_long).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace dcp::launch
