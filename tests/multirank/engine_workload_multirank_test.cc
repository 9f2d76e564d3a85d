// A random engine workload: DcpEngine driven as an inference engine drives it, over many steps.
// Requests arrive (fresh prefills, or extends that start on a live request's prefix blocks, as
// prefix caching does), decode, verify drafts and roll rejected ones back (a shorter seq_len
// the next time they run), sit steps out, and finish (their blocks go back to the rank's pool and
// are handed out again). Every step plans once and runs two layers, each with its own weights
// and paged cache over the same block tables. Block ids come from each rank's own shuffled pool;
// table entries past what a request needs hold garbage; the caches start as NaN, so a read of a
// row no step wrote cannot pass. Every layer of every step must equal the float64 reference of
// the sequences as they stand, whatever the route, combine, interleave, cache format (bf16 or
// fp8_ds_mla), decode threshold, workspace size and output dtype the workload drew. Some steps
// pass the engine's slot mapping too; some first offer a bad block id or slot mapping on rank 0:
// refused on every rank, and the step runs once the right tables are planned. The same workloads
// run through DcpContext (one per layer); there some steps first pass a bad top-k entry in a
// decode's row: refused on every rank, outputs untouched, and the step then runs as drawn.
//
// The request lifecycle is drawn from one seed every rank shares; block ids from a seed per rank.
#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <numeric>
#include <random>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/environment.h"
#include "runtime/dcp.h"
#include "runtime/engine.h"
#include "runtime/scratch.h"
#include "tests/multirank/layer_test_harness.h"
#include "tests/reference/fp8_ds_mla_reference.h"
#include "tests/reference/mla_reference.h"

namespace dcp::testing {
namespace {

constexpr int kLayers = 2;
enum Tensor { kQNope = 1, kQRope, kKvC, kKPe, kWUk, kWUv, kTensors };

// What one workload draws: the options every rank runs with.
struct Workload {
  Dims dims;
  int block_size = 16, interleave = 1, index_topk = 64, decode_threshold = 1;
  CombineBackend combine = CombineBackend::kAllGatherReduceScatter;
  bool fp8 = false, force_mqa = false;
  int64_t workspace_rows = 0;  // 0: the formula's size; else small, for several chunks
  int max_seq_len = 160;
  // The first step's prompts end within rank 0's first interleave unit: every other rank holds
  // no row of the step and passes empty block tables (data null, stride 0).
  bool short_first_step = false;
};

std::string Describe(const Workload& s) {
  std::string text =
      "B " + std::to_string(s.block_size) + " I " + std::to_string(s.interleave) + " K " +
      std::to_string(s.index_topk) + " threshold " + std::to_string(s.decode_threshold) +
      " combine " + combine_backend_name(s.combine) + " workspace " +
      std::to_string(s.workspace_rows) + (s.fp8 ? " fp8_ds_mla" : " bf16") +
      (s.force_mqa ? " force_mqa" : "") + (s.short_first_step ? " short first step" : "");
  return text;
}

Workload DrawWorkload(std::mt19937_64& rng, int world) {
  Workload s;
  s.fp8 = rng() % 3 == 0;
  s.dims = TestDims(UseCuda() ? 8 : 2 * world);
  if (s.fp8) {  // fp8_ds_mla is defined for R = 512, Dr = 64
    s.dims.r = 512;
    s.dims.dr = 64;
  }
  const int blocks[] = {4, 8, 16};
  s.block_size = blocks[rng() % 3];
  const int interleaves[] = {1, 2, s.block_size};
  s.interleave = interleaves[rng() % 3];
  s.index_topk = rng() % 2 ? 64 : 32;
  const int thresholds[] = {1, 1, 2, 4};
  s.decode_threshold = thresholds[rng() % 4];
  s.combine = rng() % 2 ? CombineBackend::kAllGatherReduceScatter : CombineBackend::kAllToAll;
  s.force_mqa = rng() % 6 == 0;
  s.workspace_rows = rng() % 2 ? 0 : int64_t(8 + rng() % 40);
  s.short_first_step = rng() % 3 == 0;
  return s;
}

DcpOptions WorkloadOptions(const Workload& s, int world, int rank) {
  DcpOptions options = RankOptions(s.dims, world, rank);
  options.dcp.interleave = s.interleave;
  options.dcp.combine = s.combine;
  options.scheduler.block_size = s.block_size;
  options.scheduler.decode_threshold = s.decode_threshold;
  options.scheduler.max_num_seqs = 16;
  options.scheduler.max_model_len = 1024;
  options.attention.index_topk = s.index_topk;
  options.attention.force_mqa = s.force_mqa;
  if (s.fp8) options.attention.kv_cache_dtype = KvCacheDType::kFp8DsMla;
  options.workspace_rows_override = s.workspace_rows;
  return options;
}

// Owner of global position g and its local row, from DESIGN.md section 4 written out again
// (the engine's KvLayout is not used here).
int OwnerOf(int64_t g, int interleave, int world) { return int((g / interleave) % world); }
int64_t LocalRowOf(int64_t g, int interleave, int world) {
  return (g / (int64_t(interleave) * world)) * interleave + g % interleave;
}
int64_t LocalLength(int64_t length, int interleave, int world, int rank) {
  int64_t count = 0;
  for (int64_t g = 0; g < length; ++g) count += OwnerOf(g, interleave, world) == rank;
  return count;
}

// One request as both the engine (its blocks on this rank) and the reference (the identity of
// every position's kv row) see it.
struct Request {
  int64_t id = 0;
  int cached = 0;                 // tokens in the cache: the seq_len of its last step
  std::vector<int64_t> row_keys;  // per position: the row's identity (shared prefixes share keys)
  std::vector<int32_t> blocks;    // this rank's blocks, local row j in blocks[j / B]
  int pinned = 0;                 // positions below this are shared blocks: never rolled back
};

// This rank's block pool: ids handed out in a random order, reference-counted (prefix blocks
// belong to several requests); a freed block is the next one handed out, with its previous
// owner's rows still in it (a read of a row the new owner did not write is then a wrong value,
// not a NaN).
class BlockPool {
 public:
  BlockPool(int64_t num_blocks, uint64_t seed) : refs_(num_blocks, 0) {
    free_.resize(num_blocks);
    std::iota(free_.begin(), free_.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }
  int32_t Take() {
    EXPECT_FALSE(free_.empty()) << "the test's block pool ran dry";
    if (free_.empty()) return 0;
    const int32_t id = free_.back();
    free_.pop_back();
    refs_[id] = 1;
    reused_ += used_before_[id];
    used_before_[id] = true;
    return id;
  }
  int reused() const { return reused_; }
  void Share(int32_t id) { ++refs_[id]; }
  void Release(int32_t id) {
    if (--refs_[id] == 0) free_.push_back(id);
  }

 private:
  std::vector<int32_t> free_;
  std::vector<int> refs_;
  std::vector<bool> used_before_ = std::vector<bool>(refs_.size(), false);
  int reused_ = 0;
};

// Values: a row's kv_c / k_pe from its key and layer; weights from the layer; queries from
// (step, layer, token).
float RowValue(uint64_t seed, int layer, int tensor, int64_t key, int width, int c) {
  return Value(seed, tensor + kTensors * layer, key * width + c, 1.0f);
}

// The value as the rank stores it: f32 on CPU ranks, bf16 (nearest-even) on CUDA ranks.
float Stored(float x) {
  if (!UseCuda()) return x;
  return std::bit_cast<float>(uint32_t{reference::Bf16Nearest(x)} << 16);
}

struct StepBatch {
  std::vector<int> members;  // indices into the live requests, caller order
  std::vector<BatchRequest> batch;
  bool give_topk = false;
};

class EngineWorkloadTest : public LayerRankTest {
 protected:
  // Runs `steps` steps of one drawn workload; every layer of every step is compared. Through
  // DcpEngine over the test's paged caches, or (`through_context`) through one DcpContext per
  // layer over its self-owned cache: prefixes shared by ForkRequest, rollbacks by
  // TruncateRequest.
  void RunWorkload(uint64_t seed, int steps, bool through_context);
};

void EngineWorkloadTest::RunWorkload(uint64_t seed, int steps, bool through_context) {
  std::mt19937_64 rng(seed);  // the same on every rank
  const Workload s = DrawWorkload(rng, world());
  SCOPED_TRACE(::testing::Message() << "seed " << seed << ": " << Describe(s));
  const Dims& d = s.dims;
  const int hl = d.heads / world(), width = d.r + d.dr, B = s.block_size;
  const int I = s.interleave, W = world();

  auto rank_device = MakeRankDevice(mpi_comm());
  ASSERT_TRUE(rank_device.ok()) << rank_device.status();
  Device& device = *rank_device->device;
  const DcpOptions options = WorkloadOptions(s, W, rank());
  std::unique_ptr<DcpEngine> engine;
  std::unique_ptr<DcpContext> contexts[kLayers];
  if (!through_context) {
    auto made = DcpEngine::Create(options, *rank_device->comm, device);
    ASSERT_TRUE(made.ok()) << made.status();
    engine = std::move(made).value();
  }
  const DType storage = device.storage_dtype();

  // The caches (NaN bytes until a step writes a row) and the weights of each layer.
  const int max_live = 6;
  const int64_t num_blocks = int64_t(max_live + 2) * ((s.max_seq_len + B - 1) / B + 2);
  BlockPool pool(num_blocks, Mix(seed + 7919 * (rank() + 1)));
  const size_t row_bytes = s.fp8 ? size_t(reference::kFp8RowBytes) : width * dtype_size(storage);
  ScratchBuffer caches[kLayers], w_uk[kLayers], w_uv[kLayers];
  void* cache_data[kLayers];
  const void* weights_uk[kLayers];
  const void* weights_uv[kLayers];
  for (int layer = 0; layer < kLayers; ++layer) {
    std::vector<float> uk(size_t(hl) * d.dn * d.r), uv(size_t(hl) * d.r * d.dv);
    for (size_t i = 0; i < uk.size(); ++i) {
      uk[i] = Value(seed, kWUk + kTensors * layer, int64_t(rank()) * hl * d.dn * d.r + i, 0.3f);
    }
    for (size_t i = 0; i < uv.size(); ++i) {
      uv[i] = Value(seed, kWUv + kTensors * layer, int64_t(rank()) * hl * d.r * d.dv + i, 0.3f);
    }
    if (through_context) {
      const LayerWeights host{{uk.data(), DType::kF32, {hl, d.dn, d.r}},
                              {uv.data(), DType::kF32, {hl, d.r, d.dv}}};
      auto made = DcpContext::Create(options, *rank_device->comm, device, host);
      ASSERT_TRUE(made.ok()) << made.status();
      contexts[layer] = std::move(made).value();
      continue;
    }
    const size_t bytes = size_t(num_blocks) * B * row_bytes;
    auto data = caches[layer].Reserve(device, bytes);
    ASSERT_TRUE(data.ok()) << data.status();
    ASSERT_TRUE(device.Memset(*data, 0xff, bytes).ok());
    cache_data[layer] = *data;
    auto staged_uk = Stage(device, w_uk[layer], {uk.data(), DType::kF32, {hl, d.dn, d.r}}, storage);
    auto staged_uv = Stage(device, w_uv[layer], {uv.data(), DType::kF32, {hl, d.r, d.dv}}, storage);
    ASSERT_TRUE(staged_uk.ok() && staged_uv.ok());
    weights_uk[layer] = *staged_uk;
    weights_uv[layer] = *staged_uv;
  }
  auto cache_view = [&](int layer) {
    KvCacheView view{cache_data[layer], storage, num_blocks, B, width};
    if (s.fp8) {
      view.row_stride = reference::kFp8RowBytes;
      view.format = KvCacheDType::kFp8DsMla;
    }
    return view;
  };

  std::vector<Request> live;
  int64_t next_id = 1, next_key = 1;
  // The rank's blocks for local rows [0, LocalLength(length)).
  auto grow = [&](Request& r, int length) {
    if (through_context) return;  // the context's own allocator
    const int64_t need = (LocalLength(length, I, W, rank()) + B - 1) / B;
    while (int64_t(r.blocks.size()) < need) r.blocks.push_back(pool.Take());
  };
  auto finish = [&](size_t i) {
    for (auto& ctx : contexts) {
      if (ctx != nullptr) EXPECT_TRUE(ctx->FreeRequest(live[i].id).ok());
    }
    for (int32_t id : live[i].blocks) pool.Release(id);
    live.erase(live.begin() + i);
  };

  int checked_layers = 0, forks = 0, empty_table_steps = 0;
  std::map<Route, int> routes;
  std::unordered_map<int64_t, std::vector<double>> dequantized;  // fp8: by key * kLayers + layer
  for (int step = 0; step < steps; ++step) {
    SCOPED_TRACE(::testing::Message() << "step " << step);
    // The requests already running: finish, sit out, roll back, decode, verify, extend.
    StepBatch sb;
    std::vector<int> query_lens;
    for (size_t i = 0; i < live.size();) {
      Request& r = live[i];
      const int action = int(rng() % 20);
      if (action < 2 && live.size() > 1) {
        finish(i);
        continue;
      }
      if (action >= 2 && action < 5) {  // rejected drafts: the next seq_len is shorter
        const int drop = 1 + int(rng() % 3);
        if (r.cached - drop >= std::max(r.pinned, 1)) {
          r.cached -= drop;
          for (auto& ctx : contexts) {
            if (ctx != nullptr) EXPECT_TRUE(ctx->TruncateRequest(r.id, r.cached).ok());
          }
        }
      }
      if (action == 5) {  // sits this step out
        ++i;
        continue;
      }
      int q = 1;
      if (action >= 14 && action < 18) q = 2 + int(rng() % 3);  // a draft to verify
      if (action >= 18) q = 5 + int(rng() % 20);                // a chunk of a long prompt
      if (r.cached + q > s.max_seq_len) {
        finish(i);
        continue;
      }
      sb.members.push_back(int(i));
      query_lens.push_back(q);
      ++i;
    }
    // Arrivals: fresh prompts (some longer than the top-k width), or extends on a live
    // request's prefix blocks (whole blocks on every rank: W * B positions a unit).
    const int arrivals = live.size() < 2 ? 2 : int(rng() % 3);
    for (int a = 0; a < arrivals && int(live.size()) < max_live; ++a) {
      Request r;
      r.id = next_id++;
      int q = 1 + int(rng() % (rng() % 4 == 0 ? 100 : 40));
      if (step == 0 && s.short_first_step) q = 1 + int(rng() % I);
      const int unit = W * B;
      const int donor = live.empty() ? -1 : int(rng() % live.size());
      int64_t forked_from = -1;
      if (donor >= 0 && rng() % 3 == 0 && live[donor].cached >= unit &&
          live[donor].cached < s.max_seq_len) {
        Request& from = live[donor];
        const int prefix = unit * (1 + int(rng() % (from.cached / unit)));
        q = std::min(q, s.max_seq_len - prefix);
        r.row_keys.assign(from.row_keys.begin(), from.row_keys.begin() + prefix);
        const int64_t shared = through_context ? 0 : LocalLength(prefix, I, W, rank()) / B;
        for (int64_t k = 0; k < shared; ++k) {
          r.blocks.push_back(from.blocks[k]);
          pool.Share(from.blocks[k]);
        }
        r.cached = r.pinned = prefix;
        from.pinned = std::max(from.pinned, prefix);
        forked_from = from.id;
        ++forks;
      }
      for (auto& ctx : contexts) {
        if (ctx == nullptr) continue;
        // The convenience layer's prefix caching: the context shares the blocks itself.
        const absl::Status added = forked_from < 0 ? ctx->AddRequest(r.id)
                                                   : ctx->ForkRequest(r.id, forked_from, r.cached);
        EXPECT_TRUE(added.ok()) << added;
      }
      live.push_back(std::move(r));
      sb.members.push_back(int(live.size()) - 1);
      query_lens.push_back(q);
    }
    if (sb.members.empty()) continue;
    // Caller order: decodes and prefills mixed.
    std::vector<size_t> order(sb.members.size());
    std::iota(order.begin(), order.end(), 0);
    std::shuffle(order.begin(), order.end(), rng);
    std::vector<int> members;
    std::vector<int> qs;
    for (size_t k : order) {
      members.push_back(sb.members[k]);
      qs.push_back(query_lens[k]);
    }
    sb.members = members;
    bool any_long = false;
    for (size_t k = 0; k < members.size(); ++k) {
      Request& r = live[members[k]];
      const int seq = r.cached + qs[k];
      r.row_keys.resize(seq);
      for (int g = r.cached; g < seq; ++g) r.row_keys[g] = next_key++;  // fresh rows
      grow(r, seq);
      sb.batch.push_back({r.id, seq, qs[k]});
      any_long = any_long || seq > s.index_topk;
    }
    sb.give_topk = any_long || rng() % 2 == 0;
    const size_t b = sb.batch.size();

    // This rank's tables; entries past a request's blocks hold garbage (ignored by contract). A
    // rank that holds no row of the step passes empty tables, as an engine's empty
    // [num_requests, 0] array would be: data null, stride 0.
    int64_t stride = 0;
    for (int m : members) stride = std::max<int64_t>(stride, live[m].blocks.size());
    if (stride > 0) stride += 1;
    std::vector<int32_t> tables(b * stride, 0x5eed);
    for (size_t k = 0; k < b; ++k) {
      std::copy(live[members[k]].blocks.begin(), live[members[k]].blocks.end(),
                tables.begin() + k * stride);
    }
    StepTables step_tables{stride > 0 ? tables.data() : nullptr, stride, num_blocks, B};
    if (!through_context && stride == 0) ++empty_table_steps;
    // The slot of every new token on this rank, as vLLM's slot_mapping gives it (-1: another
    // rank's); passed on some steps, for Plan to check against the tables.
    std::vector<int64_t> slot_mapping;
    for (size_t k = 0; k < b && !through_context; ++k) {
      const Request& r = live[members[k]];
      for (int64_t g = sb.batch[k].seq_len - sb.batch[k].query_len; g < sb.batch[k].seq_len; ++g) {
        const int64_t j = LocalRowOf(g, I, W);
        slot_mapping.push_back(OwnerOf(g, I, W) == rank() ? int64_t{r.blocks[j / B]} * B + j % B
                                                          : -1);
      }
    }
    if (!through_context && rng() % 2 == 0) step_tables.slot_mapping = slot_mapping.data();

    // Tokens in caller order; top-k rows as an indexer gives them: every causal position while
    // there are at most K, else K of them (the newest kept), a few rows padded with -1.
    std::vector<int64_t> token_begin(b + 1, 0);
    for (size_t k = 0; k < b; ++k) token_begin[k + 1] = token_begin[k] + sb.batch[k].query_len;
    const int64_t t = token_begin[b];
    const int K = s.index_topk;
    std::vector<int32_t> topk;
    if (sb.give_topk) {
      topk.assign(t * K, -1);
      for (size_t k = 0; k < b; ++k) {
        for (int q = 0; q < sb.batch[k].query_len; ++q) {
          const int position = int(sb.batch[k].seq_len) - int(sb.batch[k].query_len) + q;
          std::vector<int32_t> keys(position + 1);
          std::iota(keys.begin(), keys.end(), 0);
          if (int(keys.size()) > K) {
            std::swap(keys.back(), keys.front());  // the newest first, kept
            std::shuffle(keys.begin() + 1, keys.end(), rng);
            keys.resize(K - int(rng() % 3));
          }
          std::shuffle(keys.begin(), keys.end(), rng);
          std::copy(keys.begin(), keys.end(), topk.begin() + (token_begin[k] + q) * K);
        }
      }
    }
    if (!through_context && rng() % 4 == 0) {
      // Bad tables on rank 0 first: a block id outside the cache, or negative, in a block the
      // request needs (rank 0 holds position 0, so every request needs its first block there),
      // or a slot mapping that disagrees with the tables at the first new token. The error on
      // every rank, and no Run of the step until a Plan succeeds.
      std::vector<int32_t> bad = tables;
      std::vector<int64_t> bad_slots = slot_mapping;
      StepTables bad_tables{bad.data(), stride, num_blocks, B};
      const int kind = int(rng() % 3);
      const size_t k = rng() % b;
      std::string named = "slot_mapping[0]";
      if (kind < 2) {
        const int32_t id = kind == 0 ? int32_t(num_blocks) : -1;
        if (rank() == 0) bad[k * stride] = id;
        named = std::to_string(id);
      } else {
        if (rank() == 0) bad_slots[0] = bad_slots[0] < 0 ? 0 : bad_slots[0] + 1;
        bad_tables.slot_mapping = bad_slots.data();
      }
      const absl::Status refused = engine->Plan(sb.batch, bad_tables, sb.give_topk ? K : 0);
      EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
      EXPECT_NE(refused.message().find(named), std::string::npos) << refused;
      EXPECT_TRUE(engine->plan().requests.empty()) << "a refused step left a plan";
      const absl::Status unplanned = engine->Run({weights_uk[0], weights_uv[0]}, cache_view(0), {});
      EXPECT_NE(unplanned.message().find("before a successful Plan"), std::string::npos)
          << unplanned;
    }
    if (!through_context) {
      const absl::Status planned = engine->Plan(sb.batch, step_tables, sb.give_topk ? K : 0);
      ASSERT_TRUE(planned.ok()) << planned;
    }
    // Through the convenience layer, some steps first hand layer 0 a bad top-k entry in a
    // decode's row (every route reads a decode's row): a future key or an index below -1.
    // Refused on every rank, nothing committed: the step then runs as drawn.
    int64_t bad_token = -1;
    int32_t bad_value = 0;
    if (through_context && sb.give_topk && rng() % 3 == 0) {
      for (size_t k = 0; k < b && bad_token < 0; ++k) {
        if (sb.batch[k].query_len <= s.decode_threshold) {
          bad_token = token_begin[k];
          bad_value = rng() % 2 ? int32_t(sb.batch[k].seq_len - sb.batch[k].query_len + 1) : -7;
        }
      }
    }

    for (int layer = 0; layer < kLayers; ++layer) {
      SCOPED_TRACE(::testing::Message() << "layer " << layer);
      const uint64_t qseed = Mix(seed ^ Mix(uint64_t(step) * kLayers + layer + 1));
      auto q_value = [&](int tensor, int64_t token, int h, int width_of, int c) {
        return Value(qseed, tensor, (token * d.heads + h) * width_of + c, 1.0f);
      };
      // This rank's inputs, caller order: its heads of the queries, the new tokens' rows.
      std::vector<float> q_nope, q_rope, kv_new;
      for (size_t k = 0; k < b; ++k) {
        const Request& r = live[members[k]];
        const int seq = int(sb.batch[k].seq_len), q_len = int(sb.batch[k].query_len);
        for (int q = 0; q < q_len; ++q) {
          const int64_t token = token_begin[k] + q;
          for (int h = rank() * hl; h < (rank() + 1) * hl; ++h) {
            for (int c = 0; c < d.dn; ++c) q_nope.push_back(q_value(kQNope, token, h, d.dn, c));
            for (int c = 0; c < d.dr; ++c) q_rope.push_back(q_value(kQRope, token, h, d.dr, c));
          }
          const int64_t key = r.row_keys[seq - q_len + q];
          for (int c = 0; c < d.r; ++c) kv_new.push_back(RowValue(seed, layer, kKvC, key, d.r, c));
          for (int c = 0; c < d.dr; ++c) kv_new.push_back(RowValue(seed, layer, kKPe, key, d.dr, c));
        }
      }

      const bool bf16_out = rng() % 2 == 0;
      std::vector<float> out(size_t(t) * hl * d.dv, std::nanf("")), lse(size_t(t) * hl);
      std::vector<uint16_t> out_bits(bf16_out ? out.size() : 0, 0x7fc0);  // bf16 NaN
      Route route = Route::kSparseMqa;
      if (through_context) {
        BatchInputs inputs{{q_nope.data(), DType::kF32, {t, hl, d.dn}},
                           {q_rope.data(), DType::kF32, {t, hl, d.dr}},
                           {kv_new.data(), DType::kF32, {t, width}},
                           {}};
        if (sb.give_topk) inputs.topk = {topk.data(), DType::kI32, {t, K}};
        std::fill(lse.begin(), lse.end(), std::nanf(""));
        BatchOutputs outputs{{out.data(), DType::kF32, {t, hl, d.dv}},
                             {lse.data(), DType::kF32, {t, hl}}};
        if (bf16_out) outputs.out = {out_bits.data(), DType::kBF16, {t, hl, d.dv}};
        if (layer == 0 && bad_token >= 0) {
          std::vector<int32_t> bad = topk;
          bad[bad_token * K + int64_t(rng() % K)] = bad_value;
          BatchInputs bad_inputs = inputs;
          bad_inputs.topk = {bad.data(), DType::kI32, {t, K}};
          const absl::Status refused = contexts[0]->Forward(sb.batch, bad_inputs, outputs);
          EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument) << refused;
          EXPECT_NE(refused.message().find(bad_value < 0 ? "is below -1" : "a future key"),
                    std::string::npos)
              << refused;
          const bool untouched =
              std::all_of(lse.begin(), lse.end(), [](float v) { return std::isnan(v); }) &&
              std::all_of(out.begin(), out.end(), [](float v) { return std::isnan(v); }) &&
              std::all_of(out_bits.begin(), out_bits.end(), [](uint16_t v) { return v == 0x7fc0; });
          EXPECT_TRUE(untouched) << "a refused Forward wrote its outputs";
        }
        const absl::Status ran = contexts[layer]->Forward(sb.batch, inputs, outputs);
        ASSERT_TRUE(ran.ok()) << ran;
        route = contexts[layer]->last_stats().route;
      } else {
        ScratchBuffer qn, qr, kn, tk, ob, lb;
        auto d_q_nope = Stage(device, qn, {q_nope.data(), DType::kF32, {t, hl, d.dn}}, storage);
        auto d_q_rope = Stage(device, qr, {q_rope.data(), DType::kF32, {t, hl, d.dr}}, storage);
        auto d_kv_new = Stage(device, kn, {kv_new.data(), DType::kF32, {t, width}}, storage);
        absl::StatusOr<void*> d_topk = nullptr;
        if (sb.give_topk) {
          d_topk = Stage(device, tk, {topk.data(), DType::kI32, {t, K}}, DType::kI32);
        }
        const size_t out_bytes = size_t(t) * hl * d.dv * (bf16_out ? 2 : 4);
        auto d_out = ob.Reserve(device, out_bytes);
        auto d_lse = lb.Reserve(device, size_t(t) * hl * 4);
        for (const absl::Status& st : {d_q_nope.status(), d_q_rope.status(), d_kv_new.status(),
                                       d_topk.status(), d_out.status(), d_lse.status()}) {
          ASSERT_TRUE(st.ok()) << st;
        }
        ASSERT_TRUE(device.Memset(*d_out, 0xff, out_bytes).ok());  // NaN until written
        ASSERT_TRUE(device.Memset(*d_lse, 0xff, size_t(t) * hl * 4).ok());
        LayerTensors tensors{*d_q_nope,
                             *d_q_rope,
                             *d_kv_new,
                             static_cast<const int32_t*>(*d_topk),
                             *d_out,
                             static_cast<float*>(*d_lse),
                             bf16_out ? DType::kBF16 : DType::kF32};
        const LayerWeightsView weights{weights_uk[layer], weights_uv[layer]};
        absl::Status ran = engine->Run(weights, cache_view(layer), tensors);
        if (ran.ok()) ran = device.Synchronize();
        ASSERT_TRUE(ran.ok()) << ran;
        if (bf16_out) {
          ASSERT_TRUE(device.CopyToHost(out_bits.data(), *d_out, out_bytes).ok());
        } else {
          ASSERT_TRUE(device.CopyToHost(out.data(), *d_out, out_bytes).ok());
        }
        ASSERT_TRUE(device.CopyToHost(lse.data(), *d_lse, lse.size() * 4).ok());
        route = engine->plan().route;
      }
      for (size_t i = 0; i < out_bits.size(); ++i) {
        out[i] = std::bit_cast<float>(uint32_t{out_bits[i]} << 16);
      }
      if (layer == 0) ++routes[route];

      // The whole problem in caller order, for the reference. With fp8_ds_mla the keys read
      // from the cache are the dequantized rows; the dense route reads a prompt's new tokens
      // fresh (DESIGN.md / FORMATS.md), every other key from the cache.
      reference::MlaProblem whole;
      whole.num_heads = d.heads;
      whole.kv_lora_rank = d.r;
      whole.qk_nope_head_dim = d.dn;
      whole.qk_rope_head_dim = d.dr;
      whole.v_head_dim = d.dv;
      for (int64_t i = 0; i < int64_t(d.heads) * d.dn * d.r; ++i) {
        whole.w_uk.push_back(Value(seed, kWUk + kTensors * layer, i, 0.3f));
      }
      for (int64_t i = 0; i < int64_t(d.heads) * d.r * d.dv; ++i) {
        whole.w_uv.push_back(Value(seed, kWUv + kTensors * layer, i, 0.3f));
      }
      std::vector<float> kv_c(d.r), k_pe(d.dr);
      for (size_t k = 0; k < b; ++k) {
        const Request& r = live[members[k]];
        const int seq = int(sb.batch[k].seq_len), q_len = int(sb.batch[k].query_len);
        whole.seq_lens.push_back(seq);
        whole.query_lens.push_back(q_len);
        const bool fresh_new = route == Route::kDenseMha && q_len > s.decode_threshold;
        for (int g = 0; g < seq; ++g) {
          const int64_t key = r.row_keys[g];
          for (int c = 0; c < d.r; ++c) kv_c[c] = RowValue(seed, layer, kKvC, key, d.r, c);
          for (int c = 0; c < d.dr; ++c) k_pe[c] = RowValue(seed, layer, kKPe, key, d.dr, c);
          if (s.fp8 && !(fresh_new && g >= seq - q_len)) {
            // A row's dequantized values, once per (row, layer): the host quantizer is slow.
            std::vector<double>& values = dequantized[key * kLayers + layer];
            if (values.empty()) {
              for (float& v : kv_c) v = Stored(v);
              for (float& v : k_pe) v = Stored(v);
              values = reference::DequantizeFp8DsMlaRow(
                  reference::QuantizeFp8DsMlaRow(kv_c.data(), k_pe.data()).data());
            }
            whole.kv_c.insert(whole.kv_c.end(), values.begin(), values.begin() + d.r);
            whole.k_pe.insert(whole.k_pe.end(), values.begin() + d.r, values.end());
          } else {
            whole.kv_c.insert(whole.kv_c.end(), kv_c.begin(), kv_c.end());
            whole.k_pe.insert(whole.k_pe.end(), k_pe.begin(), k_pe.end());
          }
        }
        for (int q = 0; q < q_len; ++q) {
          const int64_t token = token_begin[k] + q;
          for (int h = 0; h < d.heads; ++h) {
            for (int c = 0; c < d.dn; ++c) whole.q_nope.push_back(q_value(kQNope, token, h, d.dn, c));
            for (int c = 0; c < d.dr; ++c) whole.q_rope.push_back(q_value(kQRope, token, h, d.dr, c));
          }
        }
      }
      if (sb.give_topk) {
        whole.topk = topk;
        whole.topk_width = K;
      }
      const reference::MlaResult ref = reference::ReferenceAttention(whole);
      ExpectRankOutputsMatch(out, lse, bf16_out, whole, ref, d, W, rank());
      if (::testing::Test::HasFatalFailure()) return;
      ++checked_layers;
    }
    for (size_t k = 0; k < b; ++k) live[members[k]].cached = int(sb.batch[k].seq_len);
  }
  EXPECT_GE(checked_layers, steps);  // most steps ran (a step without requests is skipped)
  // The short first step leaves every rank but 0 without rows: their empty tables were planned.
  if (s.short_first_step && !through_context && rank() > 0) EXPECT_GE(empty_table_steps, 1);
  if (rank() == 0) {
    std::printf("workload %s%s: %d layers checked (%d dense-route steps, %d sparse-route), "
                "%d requests on a shared prefix, %d blocks handed out again by the test\n",
                Describe(s).c_str(), through_context ? " through DcpContext" : "", checked_layers,
                routes[Route::kDenseMha], routes[Route::kSparseMqa], forks, pool.reused());
  }
}

// Workloads of 16 steps; each draws its own options. DCP_WORKLOAD_COUNT sets how many (the
// sanitizer stage and a GPU run may want fewer or more).
TEST_F(EngineWorkloadTest, RandomWorkloadsMatchTheReferenceAtEveryStep) {
  const uint64_t seed = SharedSeed();
  // The float64 reference at DeepSeek dims is slow.
  const int workloads =
      static_cast<int>(EnvInteger("DCP_WORKLOAD_COUNT", UseCuda() ? 2 : 8, 1, 1 << 20));
  for (int i = 0; i < workloads; ++i) {
    RunWorkload(Mix(seed + i), 16, /*through_context=*/false);
    if (HasFatalFailure()) return;
  }
}

// The same workloads through the convenience layer (DcpContext, one per layer, each with its
// self-owned cache and deterministic block allocator): arrivals (prefix sharing by
// ForkRequest), rollbacks by TruncateRequest, finished requests freed and their blocks reused.
TEST_F(EngineWorkloadTest, RandomWorkloadsThroughTheConvenienceLayer) {
  const uint64_t seed = SharedSeed();
  const int workloads =
      static_cast<int>(EnvInteger("DCP_WORKLOAD_COUNT", UseCuda() ? 1 : 4, 1, 1 << 20));
  for (int i = 0; i < workloads; ++i) {
    RunWorkload(Mix(seed + 1000 + i), 16, /*through_context=*/true);
    if (HasFatalFailure()) return;
  }
}

}  // namespace
}  // namespace dcp::testing
