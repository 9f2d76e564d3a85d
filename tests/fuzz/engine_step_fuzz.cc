// Fuzz target: one engine step (runtime/engine.h) from bytes, as an engine could hand it over:
// the batch (seq_len, query_len per request, any integers), this rank's block tables (stride,
// block count, block size, any ids), the top-k width, an optional slot mapping, and then the
// layer itself over a cache of the tables' size with the top-k rows taken from the bytes too.
// One CPU rank (LocalCommunicator), tiny dims. Whatever the bytes say, Plan and Run return a
// status (never a crash, a hang or a read or write outside the buffers: the sanitizer build
// checks those); a refused step is InvalidArgument; a step that runs gives finite outputs when
// its top-k rows are valid.
#include <cmath>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "collectives/local_communicator.h"
#include "core/environment.h"
#include "runtime/device.h"
#include "runtime/engine.h"

namespace {

// Reads the fuzz input front to back; past its end every read is 0.
class Bytes {
 public:
  Bytes(const uint8_t* data, size_t size) : data_(data), size_(size) {}
  uint32_t U32() {
    uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value = value << 8 | (pos_ < size_ ? data_[pos_++] : 0);
    return value;
  }
  int32_t I32() { return static_cast<int32_t>(U32()); }
  // In [lo, hi].
  int Int(int lo, int hi) { return lo + static_cast<int>(U32() % uint32_t(hi - lo + 1)); }
  // Mostly in [lo, hi], now and then any 32-bit value (negative, huge).
  int32_t Near(int lo, int hi) { return U32() % 8 == 0 ? I32() : Int(lo, hi); }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_ = 0;
};

void Check(bool ok) {
  if (!ok) std::abort();
}

// The codes a refused step may carry; anything else is a finding.
bool Refusal(const absl::Status& status) {
  return status.code() == absl::StatusCode::kInvalidArgument ||
         status.code() == absl::StatusCode::kResourceExhausted ||
         status.code() == absl::StatusCode::kFailedPrecondition;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  Bytes in(data, size);
  dcp::DcpOptions options;
  options.model.num_heads = 2;
  options.model.kv_lora_rank = 16;
  options.model.qk_nope_head_dim = 8;
  options.model.qk_rope_head_dim = 8;
  options.model.v_head_dim = 8;
  options.scheduler.block_size = 1 << in.Int(0, 4);
  options.scheduler.decode_threshold = in.Int(1, 4);
  options.scheduler.max_num_seqs = 8;
  options.scheduler.max_model_len = 256;
  options.attention.index_topk = in.Int(1, 64);
  options.attention.force_mqa = in.Int(0, 3) == 0;
  options.workspace_rows_override = in.Int(0, 1) ? 0 : in.Int(1, 64);
  static dcp::LocalCommunicator comm;
  static std::unique_ptr<dcp::Device> device = dcp::MakeCpuDevice(dcp::DType::kF32);
  auto made = dcp::DcpEngine::Create(options, comm, *device);
  Check(made.ok());
  dcp::DcpEngine& engine = **made;

  // The step.
  const int num_requests = in.Int(0, 9);
  std::vector<dcp::BatchRequest> batch;
  int64_t tokens = 0;
  for (int i = 0; i < num_requests; ++i) {
    const int32_t seq_len = in.Near(1, 300);
    const int32_t query_len = in.U32() % 2 ? 1 : in.Near(1, 300);
    batch.push_back({in.Near(0, 9), seq_len, query_len});
    if (query_len > 0 && query_len < (1 << 16)) tokens += query_len;
  }
  const int block_size = in.Int(0, 7) == 0 ? in.Near(1, 32) : options.scheduler.block_size;
  // The table buffer always holds [num_requests, stride] ids (the contract: dcp cannot see a
  // pointer's extent); stride, block count and ids are otherwise free.
  const int64_t stride = in.Int(0, 80);
  const int64_t num_blocks = in.Near(1, 600);
  std::vector<int32_t> table(size_t(num_requests) * stride);
  for (size_t i = 0; i < table.size(); ++i) {
    // Mostly a valid and distinct id; sometimes a repeat, a negative or a huge one.
    table[i] =
        in.U32() % 16 == 0 ? in.I32() : static_cast<int32_t>(i % std::max<int64_t>(num_blocks, 1));
  }
  std::vector<int64_t> slot_mapping;
  const bool give_slots = in.Int(0, 3) == 0 && tokens < (1 << 16);
  for (int64_t t = 0; give_slots && t < tokens; ++t) slot_mapping.push_back(in.Near(-1, 4096));
  const int topk_width = in.Int(0, 3) == 0 ? in.Int(-2, 130) : options.attention.index_topk;
  dcp::StepTables tables{table.data(), stride, num_blocks, block_size};
  if (give_slots) tables.slot_mapping = slot_mapping.data();
  const absl::Status planned = engine.Plan(batch, tables, topk_width);
  // DCP_FUZZ_VERBOSE=1: what each input came to (to check that the seeds plan and run).
  static const bool verbose = dcp::EnvSwitch("DCP_FUZZ_VERBOSE", false);
  if (verbose) {
    std::fprintf(stderr, "engine_step: %zu requests, plan: %s\n", batch.size(),
                 planned.ok() ? dcp::route_name(engine.plan().route)
                              : std::string(planned.message()).c_str());
  }
  if (!planned.ok()) {
    Check(Refusal(planned));
    return 0;
  }

  // A cache this test will not allocate (an empty step plans with any tables: no blocks, a
  // block size below one or far above the scheduler's).
  if (num_blocks > 4096 || num_blocks < 1 || block_size < 1 || block_size > 64) return 0;
  // The layer over a cache of the tables' size; top-k rows from the bytes (request-local
  // positions, mostly causal, sometimes anything: the engine must not read outside the cache).
  const dcp::ModelDims& m = options.model;
  const int width = m.latent_width(), heads = m.num_heads;
  const int64_t t = engine.plan().num_tokens;
  std::vector<float> cache(size_t(num_blocks) * block_size * width, 0.5f);
  std::vector<float> q_nope(size_t(t) * heads * m.qk_nope_head_dim, 0.25f);
  std::vector<float> q_rope(size_t(t) * heads * m.qk_rope_head_dim, 0.25f);
  std::vector<float> kv_new(size_t(t) * width, 0.125f);
  std::vector<int32_t> topk(size_t(t) * topk_width, -1);
  bool valid_topk = true;
  for (int64_t token = 0, k = 0; k < num_requests; ++k) {
    for (int q = 0; q < batch[k].query_len; ++q, ++token) {
      const int position = batch[k].seq_len - batch[k].query_len + q;
      for (int c = 0; c < topk_width; ++c) {
        const int32_t index = in.U32() % 32 == 0 ? in.I32() : in.Int(-1, position);
        // Valid: -1, or a position in [0, position] not already in the row.
        bool repeated = false;
        for (int e = 0; e < c; ++e)
          repeated = repeated || (index >= 0 && topk[token * topk_width + e] == index);
        valid_topk = valid_topk && index >= -1 && index <= position && !repeated;
        topk[token * topk_width + c] = index;
      }
    }
  }
  std::vector<float> out(size_t(t) * heads * m.v_head_dim, std::nanf(""));
  std::vector<float> lse(size_t(t) * heads, std::nanf(""));
  const dcp::KvCacheView view{cache.data(), dcp::DType::kF32, num_blocks, block_size, width};
  const dcp::LayerTensors tensors{q_nope.data(), q_rope.data(),
                                  kv_new.data(), topk_width > 0 ? topk.data() : nullptr,
                                  out.data(),    lse.data()};
  std::vector<float> w_uk(size_t(heads) * m.qk_nope_head_dim * m.kv_lora_rank, 0.01f);
  std::vector<float> w_uv(size_t(heads) * m.kv_lora_rank * m.v_head_dim, 0.02f);
  const absl::Status ran = engine.Run({w_uk.data(), w_uv.data()}, view, tensors);
  if (verbose) {
    std::fprintf(stderr, "engine_step: run: %s (top-k rows %s)\n",
                 ran.ok() ? "ok" : std::string(ran.message()).c_str(),
                 valid_topk ? "valid" : "not valid");
  }
  if (!ran.ok()) {
    Check(Refusal(ran));
    return 0;
  }
  if (valid_topk) {
    for (float v : out) Check(std::isfinite(v));
    for (float v : lse) Check(!std::isnan(v));  // -inf where a token selected no key
  }
  return 0;
}
