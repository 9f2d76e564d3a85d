// A decode step of DcpEngine captured in a CUDA graph and replayed equals the eager run, bit
// for bit: one rank, one GPU, NCCL world of one in stream order (the engine's own path on the
// caller's stream); then a second step with new inputs, replayed again, equals its eager run;
// then memory the kernels cannot take is refused before anything is written.
#include <cuda_runtime.h>
#include <nccl.h>

#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "collectives/cuda/nccl_communicator.h"
#include "gtest/gtest.h"
#include "runtime/cuda/cuda_device.h"
#include "runtime/engine.h"
#include "runtime/scratch.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

class EngineGraphTest : public GpuTest {};

TEST_F(EngineGraphTest, CapturedDecodeStepReplaysEqualToEager) {
  constexpr int kHeads = 16, kR = 512, kDn = 128, kDr = 64, kDv = 128, kWidth = kR + kDr;
  constexpr int kBlock = 64, kBlocks = 8 * 20, kTopk = 256;
  auto made_device = CudaDevice::Create(0);
  ASSERT_TRUE(made_device.ok()) << made_device.status();
  CudaDevice& device = **made_device;
  cudaStream_t stream = nullptr;
  DCP_ASSERT_CUDA(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
  ncclComm_t nccl = nullptr;
  int ordinal = 0;
  ASSERT_EQ(ncclCommInitAll(&nccl, 1, &ordinal), ncclSuccess);
  NcclOptions nccl_options;
  nccl_options.timeout_s = 30.0;
  auto comm = NcclCommunicator::Adopt(nccl, nccl_options, NcclCommunicator::Ownership::kOwned);
  ASSERT_TRUE(comm.ok()) << comm.status();

  DcpOptions options;
  options.model = ModelDims::DeepSeekV32();  // the head sizes the CUDA kernels are built for
  options.model.num_heads = kHeads;
  options.scheduler.block_size = kBlock;
  options.scheduler.max_num_seqs = 8;
  options.scheduler.max_model_len = 2048;
  options.attention.index_topk = kTopk;
  auto engine = DcpEngine::Create(options, **comm, device);
  ASSERT_TRUE(engine.ok()) << engine.status();

  // A padded decode batch of 8 requests over 1000-odd cached tokens, random top-k.
  std::mt19937 rng(static_cast<uint32_t>(TestSeed()));
  std::uniform_real_distribution<float> value(-1.0f, 1.0f);
  std::vector<BatchRequest> batch;
  std::vector<int32_t> tables(8 * 20);
  for (int i = 0; i < 8; ++i) {
    batch.push_back({i, 900 + 37 * i, 1});  // <= 1159 tokens: at most 19 blocks of 64
    for (int k = 0; k < 20; ++k) tables[i * 20 + k] = (k * 8 + i * 3) % kBlocks;  // distinct
  }
  const int64_t t = 8;
  auto random = [&](size_t n) {
    std::vector<float> v(n);
    for (float& x : v) x = value(rng);
    return v;
  };
  ScratchBuffer cache_b, w_uk_b, w_uv_b, q_nope_b, q_rope_b, kv_b, topk_b, out_b, lse_b;
  auto to_device = [&](ScratchBuffer& b, const std::vector<float>& host,
                       std::vector<int64_t> shape) {
    auto staged = Stage(device, b, TensorView{host.data(), DType::kF32, std::move(shape)},
                        DType::kBF16);
    EXPECT_TRUE(staged.ok()) << staged.status();
    return staged.ok() ? *staged : nullptr;
  };
  void* cache = to_device(cache_b, random(size_t(kBlocks) * kBlock * kWidth),
                          {kBlocks * kBlock, kWidth});
  void* w_uk = to_device(w_uk_b, random(size_t(kHeads) * kDn * kR), {kHeads, kDn, kR});
  void* w_uv = to_device(w_uv_b, random(size_t(kHeads) * kR * kDv), {kHeads, kR, kDv});
  void* q_nope = to_device(q_nope_b, random(t * kHeads * kDn), {t, kHeads, kDn});
  void* q_rope = to_device(q_rope_b, random(t * kHeads * kDr), {t, kHeads, kDr});
  void* kv_new = to_device(kv_b, random(t * kWidth), {t, kWidth});
  std::vector<int32_t> topk(t * kTopk);
  for (int64_t i = 0; i < t; ++i) {
    for (int k = 0; k < kTopk; ++k) topk[i * kTopk + k] = (k * 3 + int(i)) % batch[i].seq_len;
  }
  auto topk_d = topk_b.Reserve(device, topk.size() * 4);
  ASSERT_TRUE(topk_d.ok());
  ASSERT_TRUE(device.CopyFromHost(*topk_d, topk.data(), topk.size() * 4).ok());
  auto out_d = out_b.Reserve(device, size_t(t) * kHeads * kDv * 4);
  auto lse_d = lse_b.Reserve(device, size_t(t) * kHeads * 4);
  ASSERT_TRUE(out_d.ok() && lse_d.ok());

  const absl::Status planned = (*engine)->Plan(batch, {tables.data(), 20, kBlocks, kBlock}, kTopk);
  ASSERT_TRUE(planned.ok()) << planned;
  const LayerWeightsView weights{w_uk, w_uv};
  const KvCacheView cache_view{cache, DType::kBF16, kBlocks, kBlock, kWidth};
  const LayerTensors tensors{q_nope, q_rope, kv_new, static_cast<const int32_t*>(*topk_d),
                             static_cast<float*>(*out_d), static_cast<float*>(*lse_d)};
  // Eager on the stream (binds it: before any capture), then the same layer captured.
  const absl::Status eager = (*engine)->Run(weights, cache_view, tensors, stream);
  ASSERT_TRUE(eager.ok()) << eager;
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> eager_out(t * kHeads * kDv), eager_lse(t * kHeads);
  DCP_ASSERT_CUDA(cudaMemcpy(eager_out.data(), *out_d, eager_out.size() * 4, cudaMemcpyDefault));
  DCP_ASSERT_CUDA(cudaMemcpy(eager_lse.data(), *lse_d, eager_lse.size() * 4, cudaMemcpyDefault));
  for (float x : eager_lse) ASSERT_TRUE(std::isfinite(x));

  cudaGraph_t graph = nullptr;
  DCP_ASSERT_CUDA(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal));
  const absl::Status captured = (*engine)->Run(weights, cache_view, tensors, stream);
  DCP_ASSERT_CUDA(cudaStreamEndCapture(stream, &graph));
  ASSERT_TRUE(captured.ok()) << captured;
  cudaGraphExec_t exec = nullptr;
  DCP_ASSERT_CUDA(cudaGraphInstantiate(&exec, graph, 0));
  DCP_ASSERT_CUDA(cudaMemsetAsync(*out_d, 0xFF, eager_out.size() * 4, stream));  // poison
  DCP_ASSERT_CUDA(cudaMemsetAsync(*lse_d, 0xFF, eager_lse.size() * 4, stream));
  DCP_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  ASSERT_TRUE((*comm)->WatchStream("engine graph").ok());
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  std::vector<float> replay_out(eager_out.size()), replay_lse(eager_lse.size());
  DCP_ASSERT_CUDA(cudaMemcpy(replay_out.data(), *out_d, replay_out.size() * 4, cudaMemcpyDefault));
  DCP_ASSERT_CUDA(cudaMemcpy(replay_lse.data(), *lse_d, replay_lse.size() * 4, cudaMemcpyDefault));
  EXPECT_EQ(0, std::memcmp(replay_out.data(), eager_out.data(), eager_out.size() * 4));
  EXPECT_EQ(0, std::memcmp(replay_lse.data(), eager_lse.data(), eager_lse.size() * 4));

  // New queries in the same buffers: the replay follows them and equals a fresh eager run.
  const std::vector<float> q2 = random(t * kHeads * kDn);
  void* q2_d = to_device(q_nope_b, q2, {t, kHeads, kDn});
  ASSERT_EQ(q2_d, q_nope);  // same buffer (no growth)
  const std::vector<float> first_out = replay_out;
  DCP_ASSERT_CUDA(cudaMemsetAsync(*out_d, 0xFF, eager_out.size() * 4, stream));  // poison
  DCP_ASSERT_CUDA(cudaGraphLaunch(exec, stream));
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  DCP_ASSERT_CUDA(cudaMemcpy(replay_out.data(), *out_d, replay_out.size() * 4, cudaMemcpyDefault));
  // The replay read the new queries: its output moved (a replay of stale inputs would equal a
  // stale eager run below too).
  EXPECT_NE(0, std::memcmp(replay_out.data(), first_out.data(), first_out.size() * 4));
  DCP_ASSERT_CUDA(cudaMemsetAsync(*out_d, 0xFF, eager_out.size() * 4, stream));  // poison
  ASSERT_TRUE((*engine)->Run(weights, cache_view, tensors, stream).ok());
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  DCP_ASSERT_CUDA(cudaMemcpy(eager_out.data(), *out_d, eager_out.size() * 4, cudaMemcpyDefault));
  EXPECT_EQ(0, std::memcmp(replay_out.data(), eager_out.data(), eager_out.size() * 4));

  DCP_ASSERT_CUDA(cudaGraphExecDestroy(exec));
  DCP_ASSERT_CUDA(cudaGraphDestroy(graph));

  // Memory the kernels cannot take (a cache off its 16-byte alignment, a bf16 row stride that
  // is not a multiple of 8, a BF16 out off its 4-byte alignment) is refused before Run writes
  // anything: the step's new rows (fresh values, so a write would show) are not in the cache.
  ASSERT_EQ(to_device(kv_b, random(t * kWidth), {t, kWidth}), kv_new);
  const size_t cache_bytes = size_t(kBlocks) * kBlock * kWidth * 2;
  std::vector<char> cache_before(cache_bytes), cache_after(cache_bytes);
  DCP_ASSERT_CUDA(cudaMemcpy(cache_before.data(), cache, cache_bytes, cudaMemcpyDefault));
  KvCacheView shifted = cache_view;
  shifted.data = static_cast<char*>(cache) + 8;
  KvCacheView wide = cache_view;
  wide.row_stride = kWidth + 4;  // (its blocks would run past the allocation: never read)
  LayerTensors bf16_out = tensors;
  bf16_out.out = static_cast<char*>(*out_d) + 2;
  bf16_out.out_dtype = DType::kBF16;
  const struct {
    KvCacheView cache;
    LayerTensors tensors;
    const char* named;
  } refused[] = {{shifted, tensors, "16-byte aligned"},
                 {wide, tensors, "row stride 1160 bytes"},
                 {cache_view, bf16_out, "4-byte aligned"}};
  for (const auto& c : refused) {
    const absl::Status status = (*engine)->Run(weights, c.cache, c.tensors, stream);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find(c.named), std::string::npos) << status;
  }
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  DCP_ASSERT_CUDA(cudaMemcpy(cache_after.data(), cache, cache_bytes, cudaMemcpyDefault));
  EXPECT_EQ(0, std::memcmp(cache_before.data(), cache_after.data(), cache_bytes));
  // The same step then runs (the plan stands) and writes them.
  ASSERT_TRUE((*engine)->Run(weights, cache_view, tensors, stream).ok());
  DCP_ASSERT_CUDA(cudaStreamSynchronize(stream));
  DCP_ASSERT_CUDA(cudaMemcpy(cache_after.data(), cache, cache_bytes, cudaMemcpyDefault));
  EXPECT_NE(0, std::memcmp(cache_before.data(), cache_after.data(), cache_bytes));
  comm->reset();
  engine->reset();
  DCP_ASSERT_CUDA(cudaStreamDestroy(stream));
}

}  // namespace
}  // namespace dcp::testing
