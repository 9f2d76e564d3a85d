// Dense MHA at both models' head sizes (DeepSeek-V3.2 qk 192 / v 128, GLM-5 qk 256 / v 256)
// through both CUDA implementations, the native kernel (attention/cuda/dense_mha.h) and cuDNN's
// fused SDPA (attention/cuda/cudnn/cudnn_sdpa.h), against float64 loops written here: ragged
// batches with empty and one-key sequences, bottom-right causal with more queries than keys,
// non-causal context chunks, 16 to 128 heads, sequences up to 8k (sampled rows), context chunks
// merged by their LSE (checks cuDNN's stats units), huge logits, the graph cache, and the two
// implementations agreeing. Without cuDNN (or a GPU) the cuDNN tests skip, and fail under
// DCP_REQUIRE_GPU=1 (the GPU machine has cuDNN 9).
#include <algorithm>
#include <cmath>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "attention/cuda/cudnn/cudnn_sdpa.h"
#include "attention/cuda/dense_mha.h"
#include "gtest/gtest.h"
#include "tests/common/gpu_test_util.h"

namespace dcp::testing {
namespace {

enum class Impl { kNative, kCudnn };
const char* ImplName(Impl impl) { return impl == Impl::kNative ? "native" : "cudnn"; }

struct SizePair {
  int qk, v;
};
constexpr SizePair kDeepSeek{192, 128};
constexpr SizePair kGlm5{256, 256};

struct Case {
  std::vector<std::pair<int, int>> seqs;  // (len_q, len_k) per sequence
  int heads = 16;
  bool causal = true;
  SizePair dims = kDeepSeek;
  float q_scale = 1.f;
  float scale = 0.f;    // 0: 1/sqrt(qk)
  int check_rows = -1;  // -1: every (query, head) row; else this many sampled
  // The dense route's layout: k and v of a head side by side in one buffer [Tk, H, qk + v],
  // and out / lse rows with padding behind them (which must stay untouched).
  bool route_layout = false;
  bool bf16_out = false;  // out written as BF16 (read back widened to float)
};

// The inputs of one case: q [Tq, H, qk], k [Tk, H, qk], v [Tk, H, v] (separate, packed, as the
// route lays them out), and the sequence boundaries.
struct Inputs {
  std::vector<bf16> q, k, v;
  std::vector<int32_t> cu_q{0}, cu_k{0};
};

Inputs MakeInputs(const Case& c, std::mt19937_64& rng) {
  Inputs in;
  for (auto [lq, lk] : c.seqs) {
    in.cu_q.push_back(in.cu_q.back() + lq);
    in.cu_k.push_back(in.cu_k.back() + lk);
  }
  const size_t tq = in.cu_q.back(), tk = in.cu_k.back(), h = c.heads;
  in.q = ToBf16(RandomFloats(rng, tq * h * c.dims.qk, -c.q_scale, c.q_scale));
  in.k = ToBf16(RandomFloats(rng, tk * h * c.dims.qk));
  in.v = ToBf16(RandomFloats(rng, tk * h * c.dims.v));
  return in;
}

struct Outputs {
  std::vector<float> out, lse;
};

// One process-wide cuDNN instance on the legacy default stream (tests run serially).
cuda::CudnnSdpa* Cudnn(absl::Status* why) {
  static absl::Status status;
  static std::unique_ptr<cuda::CudnnSdpa> instance = [] {
    auto created = cuda::CudnnSdpa::Create(nullptr);
    if (!created.ok()) {
      status = created.status();
      return std::unique_ptr<cuda::CudnnSdpa>();
    }
    return *std::move(created);
  }();
  *why = status;
  return instance.get();
}

class DensePrefillTest : public GpuTest {
 protected:
  // Skips (or fails under DCP_REQUIRE_GPU=1) when cuDNN cannot be used here.
  cuda::CudnnSdpa* RequireCudnn() {
    absl::Status why;
    cuda::CudnnSdpa* cudnn = Cudnn(&why);
    if (cudnn == nullptr) {
      if (GpuRequired()) {
        ADD_FAILURE() << "cuDNN unavailable with DCP_REQUIRE_GPU=1: " << why;
      } else {
        std::cout << "cuDNN unavailable: " << why << "\n";
      }
    }
    return cudnn;
  }

  // Runs `impl` over `in`; out and lse start poisoned (NaN). Outputs come back packed.
  absl::Status Run(Impl impl, const Case& c, const Inputs& in, Outputs* result) {
    const int heads = c.heads, qk = c.dims.qk, dv = c.dims.v;
    const size_t tq = in.cu_q.back(), tk = in.cu_k.back();
    // Route layout: kv [Tk, H, qk + dv]; out rows padded by 8 floats, lse rows by 3.
    const int64_t kv_width = qk + dv;
    const int64_t out_stride = int64_t{heads} * dv + (c.route_layout ? 8 : 0);
    const int64_t lse_stride = heads + (c.route_layout ? 3 : 0);
    std::vector<bf16> kv_host;
    if (c.route_layout) {
      kv_host.resize(std::max<size_t>(tk, 1) * heads * kv_width);
      for (size_t t = 0; t < tk; ++t) {
        for (int h = 0; h < heads; ++h) {
          bf16* row = kv_host.data() + (t * heads + h) * kv_width;
          std::copy_n(in.k.data() + (t * heads + h) * qk, qk, row);
          std::copy_n(in.v.data() + (t * heads + h) * dv, dv, row + qk);
        }
      }
    }
    DeviceArray<bf16> q(in.q), k(c.route_layout ? std::vector<bf16>() : in.k),
        v(c.route_layout ? std::vector<bf16>() : in.v), kv(kv_host);
    DeviceArray<int32_t> cu_q(in.cu_q), cu_k(in.cu_k);
    DeviceArray<float> out(c.bf16_out ? 0 : std::max<size_t>(tq, 1) * out_stride);
    DeviceArray<bf16> out_bf16(c.bf16_out ? std::max<size_t>(tq, 1) * out_stride : 0);
    DeviceArray<float> lse(std::max<size_t>(tq, 1) * lse_stride);
    out.Poison();
    out_bf16.Poison();
    lse.Poison();
    DenseMhaParams p;
    p.q = q.get();
    p.k = c.route_layout ? static_cast<const void*>(kv.get()) : k.get();
    p.v = c.route_layout ? static_cast<const void*>(kv.get() + qk) : v.get();
    p.out = c.bf16_out ? static_cast<void*>(out_bf16.get()) : out.get(), p.lse = lse.get();
    p.out_dtype = c.bf16_out ? DType::kBF16 : DType::kF32;
    p.cu_seqlens_q = cu_q.get(), p.cu_seqlens_k = cu_k.get();
    p.dtype = DType::kBF16;
    p.num_seqs = int(c.seqs.size());
    p.num_heads = heads, p.qk_dim = qk, p.v_dim = dv;
    for (auto [lq, lk] : c.seqs) {
      p.max_seqlen_q = std::max(p.max_seqlen_q, lq);
      p.max_seqlen_k = std::max(p.max_seqlen_k, lk);
    }
    p.q_token_stride = int64_t{heads} * qk;
    p.q_head_stride = qk;
    p.k_token_stride = c.route_layout ? heads * kv_width : int64_t{heads} * qk;
    p.k_head_stride = c.route_layout ? kv_width : qk;
    p.v_token_stride = c.route_layout ? heads * kv_width : int64_t{heads} * dv;
    p.v_head_stride = c.route_layout ? kv_width : dv;
    p.out_token_stride = out_stride;
    p.out_head_stride = dv;
    p.lse_token_stride = lse_stride;
    p.causal = c.causal;
    p.scale = c.scale != 0.f ? c.scale : 1.0f / std::sqrt(float(qk));
    absl::Status status;
    if (impl == Impl::kNative) {
      status = cuda::DenseMha(p, nullptr);
    } else {
      absl::Status why;
      cuda::CudnnSdpa* cudnn = Cudnn(&why);
      if (cudnn == nullptr) return why;
      status = cudnn->Run({p, in.cu_q.data(), in.cu_k.data()});
    }
    if (!status.ok()) return status;
    if (cudaDeviceSynchronize() != cudaSuccess) return absl::InternalError("device error");
    std::vector<float> out_rows = out.Download();
    const std::vector<float> lse_rows = lse.Download();
    if (c.bf16_out) {
      const std::vector<bf16> rows = out_bf16.Download();
      out_rows.resize(rows.size());
      for (size_t i = 0; i < rows.size(); ++i) out_rows[i] = bf16_to_float(rows[i]);
    }
    result->out.assign(tq * heads * dv, 0.f);
    result->lse.assign(tq * heads, 0.f);
    for (size_t t = 0; t < tq; ++t) {
      std::copy_n(out_rows.data() + t * out_stride, heads * dv,
                  result->out.data() + t * heads * dv);
      std::copy_n(lse_rows.data() + t * lse_stride, heads, result->lse.data() + t * heads);
      // The padding behind each row keeps its poison (NaN): nothing wrote past a row.
      for (int64_t i = int64_t{heads} * dv; i < out_stride; ++i) {
        if (!std::isnan(out_rows[t * out_stride + i])) {
          return absl::InternalError(absl::StrCat("out padding of token ", t, " was written"));
        }
      }
      for (int64_t i = heads; i < lse_stride; ++i) {
        if (!std::isnan(lse_rows[t * lse_stride + i])) {
          return absl::InternalError(absl::StrCat("lse padding of token ", t, " was written"));
        }
      }
    }
    return absl::OkStatus();
  }

  // Every (or a sample of) (sequence, query, head) row against float64 softmax attention.
  void Check(const Case& c, const Inputs& in, const Outputs& got, std::mt19937_64& rng) {
    const int heads = c.heads, qk = c.dims.qk, dv = c.dims.v;
    const double scale = c.scale != 0.f ? c.scale : 1.0 / std::sqrt(double(qk));
    struct Row {
      int seq, query, head;
    };
    std::vector<Row> rows;
    for (int s = 0; s < int(c.seqs.size()); ++s)
      for (int i = 0; i < c.seqs[s].first; ++i)
        for (int h = 0; h < heads; ++h) rows.push_back({s, i, h});
    if (c.check_rows >= 0 && size_t(c.check_rows) < rows.size()) {
      std::shuffle(rows.begin(), rows.end(), rng);
      rows.resize(c.check_rows);
    }
    const std::vector<double> qd = ToDouble(in.q), kd = ToDouble(in.k), vd = ToDouble(in.v);
    double diff = 0, norm = 0;
    std::vector<double> ref(dv), scores;
    for (const Row& r : rows) {
      const auto [lq, lk] = c.seqs[r.seq];
      const int visible = c.causal ? std::min(lk, lk - lq + r.query + 1) : lk;
      const int64_t token = in.cu_q[r.seq] + r.query;
      const double* qrow = qd.data() + (size_t(token) * heads + r.head) * qk;
      scores.clear();
      for (int j = 0; j < std::max(visible, 0); ++j) {
        const double* krow = kd.data() + (size_t(in.cu_k[r.seq] + j) * heads + r.head) * qk;
        double dot = 0;
        for (int i = 0; i < qk; ++i) dot += qrow[i] * krow[i];
        scores.push_back(scale * dot);
      }
      const float* row = got.out.data() + (size_t(token) * heads + r.head) * dv;
      const float row_lse = got.lse[size_t(token) * heads + r.head];
      if (scores.empty()) {
        for (int i = 0; i < dv; ++i) ASSERT_EQ(row[i], 0.f) << "query with no key";
        ASSERT_TRUE(std::isinf(row_lse) && row_lse < 0) << "lse " << row_lse;
        continue;
      }
      const double m = *std::max_element(scores.begin(), scores.end());
      double sum = 0;
      std::fill(ref.begin(), ref.end(), 0.0);
      for (size_t j = 0; j < scores.size(); ++j) {
        const double w = std::exp(scores[j] - m);
        sum += w;
        const double* vrow = vd.data() + (size_t(in.cu_k[r.seq] + j) * heads + r.head) * dv;
        for (int i = 0; i < dv; ++i) ref[i] += w * vrow[i];
      }
      for (double& x : ref) x /= sum;
      const double want_lse = m + std::log(sum);
      ASSERT_NEAR(row_lse, want_lse, 2e-3 * std::max(1.0, std::abs(want_lse)))
          << "seq " << r.seq << " query " << r.query << " head " << r.head;
      const Comparison cmp = Compare(row, ref.data(), dv);
      ASSERT_TRUE(cmp.all_finite) << "seq " << r.seq << " query " << r.query;
      ASSERT_LT(cmp.relative_error, 3e-2)
          << "seq " << r.seq << " query " << r.query << " head " << r.head;
      for (int i = 0; i < dv; ++i) {
        diff += (row[i] - ref[i]) * (row[i] - ref[i]);
        norm += ref[i] * ref[i];
      }
    }
    if (norm > 0) EXPECT_LT(std::sqrt(diff / norm), 1e-2);
  }

  // Both implementations (cuDNN only where it loads) on fresh inputs, each checked.
  void RunAndCheck(Case c) {
    std::mt19937_64 rng(TestSeed());
    const Inputs in = MakeInputs(c, rng);
    for (const Impl impl : {Impl::kNative, Impl::kCudnn}) {
      SCOPED_TRACE(ImplName(impl));
      if (impl == Impl::kCudnn && RequireCudnn() == nullptr) continue;
      Outputs got;
      const absl::Status status = Run(impl, c, in, &got);
      ASSERT_TRUE(status.ok()) << status;
      Check(c, in, got, rng);
    }
  }
};

class DensePrefillSizesTest : public DensePrefillTest,
                              public ::testing::WithParamInterface<SizePair> {};

TEST_P(DensePrefillSizesTest, CausalRaggedBatch) {
  Case c;
  c.dims = GetParam();
  // seq_len 1, a block edge, multi-block, decode over context, bottom-right with context, an
  // empty query set, 129.
  c.seqs = {{1, 1}, {5, 5}, {64, 64}, {70, 70}, {1, 300}, {130, 200}, {0, 10}, {129, 129}};
  c.heads = 16;
  RunAndCheck(c);
}

TEST_P(DensePrefillSizesTest, CausalMoreQueriesThanKeys) {
  Case c;  // the first Lq - Lk queries see no key: out 0, lse -inf
  c.dims = GetParam();
  c.seqs = {{10, 4}, {70, 3}, {5, 0}, {33, 33}};
  c.heads = 16;
  RunAndCheck(c);
}

TEST_P(DensePrefillSizesTest, NonCausalContextChunks) {
  Case c;  // a prefill absent from a chunk has zero keys there
  c.dims = GetParam();
  c.causal = false;
  c.seqs = {{37, 250}, {100, 1}, {1, 64}, {65, 129}, {3, 0}};
  c.heads = 16;
  RunAndCheck(c);
}

// Every sequence of the same power-of-two lengths: cuDNN runs these as plain strided batches
// (no ragged offsets, no padding mask); causal square, causal bottom-right (queries after
// context) and non-causal.
TEST_P(DensePrefillSizesTest, UniformBatches) {
  Case c;
  c.dims = GetParam();
  c.heads = 16;
  c.check_rows = 1500;
  c.seqs = {{256, 256}, {256, 256}};
  RunAndCheck(c);
  c.seqs = {{64, 256}, {64, 256}, {64, 256}, {64, 256}};
  RunAndCheck(c);
  c.causal = false;
  c.seqs = {{128, 512}};
  RunAndCheck(c);
}

// The dense route's layout: k and v interleaved per head in one buffer, out and lse rows with
// padding; uniform and ragged batches, causal and context chunks (with empty key ranges).
TEST_P(DensePrefillSizesTest, RouteLayout) {
  Case c;
  c.dims = GetParam();
  c.heads = 16;
  c.route_layout = true;
  c.check_rows = 1500;
  c.seqs = {{128, 128}, {128, 128}};
  RunAndCheck(c);
  c.seqs = {{1, 1}, {70, 70}, {130, 200}, {0, 10}, {10, 4}};
  RunAndCheck(c);
  c.causal = false;
  c.seqs = {{37, 250}, {100, 1}, {3, 0}, {64, 64}};
  RunAndCheck(c);
}

TEST_P(DensePrefillSizesTest, HugeLogits) {
  Case c;
  c.dims = GetParam();
  c.seqs = {{90, 90}, {17, 150}};
  c.heads = 16;
  c.q_scale = 8.f;  // logits spread about +-80
  c.scale = 0.5f;
  RunAndCheck(c);
}

TEST_P(DensePrefillSizesTest, ManyHeads) {
  Case c;  // 128 heads (DeepSeek-V3.2 on one rank), 64 (GLM-5), ragged
  c.dims = GetParam();
  c.heads = GetParam().qk == 192 ? 128 : 64;
  c.seqs = {{300, 300}, {64, 128}, {1, 77}};
  c.check_rows = 400;
  RunAndCheck(c);
}

TEST_P(DensePrefillSizesTest, LongSequence) {
  Case c;  // seq 8k causal and a 2k chunk against 8k keys, sampled rows
  c.dims = GetParam();
  c.heads = 16;
  c.seqs = {{8192, 8192}, {2048, 8192}};
  c.check_rows = 120;
  RunAndCheck(c);
}

// The context-chunk merge of the dense route: new tokens (causal) and two context chunks
// (non-causal), each through cuDNN, merged by their LSE on the host, equal the attention over
// [context | new] at once. A wrong LSE unit (log2, unscaled) fails here.
TEST_P(DensePrefillSizesTest, ChunksMergedByLseMatchTheWholeSequence) {
  if (RequireCudnn() == nullptr) GTEST_SKIP() << "cuDNN unavailable";
  const SizePair dims = GetParam();
  const int heads = 16, qk = dims.qk, dv = dims.v;
  std::mt19937_64 rng(TestSeed());
  // Per request: context length split into chunk 1 and chunk 2, then new tokens.
  struct Request {
    int chunk1, chunk2, fresh;
  };
  const std::vector<Request> requests = {{100, 60, 40}, {0, 128, 33}, {64, 0, 1}, {200, 1, 64}};
  Case whole;  // q over [context | new] keys, causal bottom-right
  whole.dims = dims;
  whole.heads = heads;
  for (const Request& r : requests) whole.seqs.push_back({r.fresh, r.chunk1 + r.chunk2 + r.fresh});
  const Inputs all = MakeInputs(whole, rng);

  // Split the keys of `all` into the three launches' packed inputs.
  auto part = [&](int which, Case* c) {
    Inputs in;
    in.q = all.q;
    in.cu_q = all.cu_q;
    c->dims = dims;
    c->heads = heads;
    c->causal = which == 2;
    for (size_t i = 0; i < requests.size(); ++i) {
      const Request& r = requests[i];
      const int begin = which == 0 ? 0 : which == 1 ? r.chunk1 : r.chunk1 + r.chunk2;
      const int count = which == 0 ? r.chunk1 : which == 1 ? r.chunk2 : r.fresh;
      c->seqs.push_back({r.fresh, count});
      in.cu_k.push_back(in.cu_k.back() + count);
      const size_t first = size_t(all.cu_k[i] + begin);
      in.k.insert(in.k.end(), all.k.begin() + first * heads * qk,
                  all.k.begin() + (first + count) * heads * qk);
      in.v.insert(in.v.end(), all.v.begin() + first * heads * dv,
                  all.v.begin() + (first + count) * heads * dv);
    }
    return in;
  };
  std::vector<Outputs> parts(3);
  for (int which = 0; which < 3; ++which) {
    Case c;
    const Inputs in = part(which, &c);
    const absl::Status status = Run(Impl::kCudnn, c, in, &parts[which]);
    ASSERT_TRUE(status.ok()) << status;
  }
  // Merge (DESIGN.md section 3) in double.
  const size_t tq = all.cu_q.back();
  Outputs merged;
  merged.out.resize(tq * heads * dv);
  merged.lse.resize(tq * heads);
  for (size_t row = 0; row < tq * heads; ++row) {
    double m = -std::numeric_limits<double>::infinity();
    for (const Outputs& o : parts) m = std::max(m, double(o.lse[row]));
    double total = 0;
    for (const Outputs& o : parts) total += std::isinf(o.lse[row]) ? 0 : std::exp(o.lse[row] - m);
    const double lse = m + std::log(total);
    merged.lse[row] = float(lse);
    for (int i = 0; i < dv; ++i) {
      double value = 0;
      for (const Outputs& o : parts) {
        if (!std::isinf(o.lse[row])) value += std::exp(o.lse[row] - lse) * o.out[row * dv + i];
      }
      merged.out[row * dv + i] = float(value);
    }
  }
  Check(whole, all, merged, rng);
}

// The two implementations agree within bf16 tolerance on the same inputs.
TEST_P(DensePrefillSizesTest, NativeAndCudnnAgree) {
  if (RequireCudnn() == nullptr) GTEST_SKIP() << "cuDNN unavailable";
  Case c;
  c.dims = GetParam();
  c.heads = 32;
  c.seqs = {{256, 256}, {64, 512}, {1, 1}, {128, 128}};
  std::mt19937_64 rng(TestSeed());
  const Inputs in = MakeInputs(c, rng);
  for (const bool causal : {true, false}) {
    c.causal = causal;
    Outputs native, cudnn;
    ASSERT_TRUE(Run(Impl::kNative, c, in, &native).ok());
    ASSERT_TRUE(Run(Impl::kCudnn, c, in, &cudnn).ok());
    double diff = 0, norm = 0;
    for (size_t i = 0; i < native.out.size(); ++i) {
      diff += (native.out[i] - cudnn.out[i]) * double(native.out[i] - cudnn.out[i]);
      norm += double(native.out[i]) * native.out[i];
    }
    EXPECT_LT(std::sqrt(diff / norm), 1e-2) << (causal ? "causal" : "non-causal");
    for (size_t i = 0; i < native.lse.size(); ++i) {
      ASSERT_NEAR(native.lse[i], cudnn.lse[i], 2e-3 * std::max(1.f, std::abs(native.lse[i])))
          << "lse " << i;
    }
  }
}

// A bf16 out is the fp32 result rounded once to nearest: bit-equal to the fp32 run rounded on
// the host, for both implementations, in every form: cuDNN's uniform graphs writing the
// caller's buffer directly (packed rows), uniform with padded rows (the finish pass), ragged
// batches with queries that see no key (zeros) and context chunks; each also against float64.
TEST_P(DensePrefillSizesTest, Bf16OutIsTheF32OutRoundedOnce) {
  struct Form {
    std::vector<std::pair<int, int>> seqs;
    bool causal, route_layout;
  };
  const Form forms[] = {
      {{{256, 256}, {256, 256}}, true, false},           // cuDNN direct
      {{{64, 256}, {64, 256}, {64, 256}, {64, 256}}, true, false},  // direct, after context
      {{{128, 512}}, false, false},                       // direct, a context chunk
      {{{128, 128}, {128, 128}}, true, true},             // uniform, padded rows: finish
      {{{1, 1}, {70, 70}, {10, 4}, {0, 10}, {130, 200}}, true, false},  // ragged, empty queries
      {{{37, 250}, {100, 1}, {3, 0}}, false, true},       // ragged chunks, padded rows
  };
  std::mt19937_64 rng(TestSeed());
  for (const Form& form : forms) {
    Case c;
    c.dims = GetParam();
    c.heads = 16;
    c.check_rows = 800;
    c.seqs = form.seqs;
    c.causal = form.causal;
    c.route_layout = form.route_layout;
    const Inputs in = MakeInputs(c, rng);
    for (const Impl impl : {Impl::kNative, Impl::kCudnn}) {
      SCOPED_TRACE(::testing::Message() << ImplName(impl) << " form " << (&form - forms));
      if (impl == Impl::kCudnn && RequireCudnn() == nullptr) continue;
      Outputs f32, rounded;
      c.bf16_out = false;
      ASSERT_TRUE(Run(impl, c, in, &f32).ok());
      c.bf16_out = true;
      const absl::Status status = Run(impl, c, in, &rounded);
      ASSERT_TRUE(status.ok()) << status;
      Check(c, in, rounded, rng);
      ASSERT_EQ(rounded.out.size(), f32.out.size());
      for (size_t i = 0; i < f32.out.size(); ++i) {
        ASSERT_EQ(rounded.out[i], bf16_to_float(float_to_bf16(f32.out[i]))) << "out " << i;
      }
      for (size_t i = 0; i < f32.lse.size(); ++i) {
        ASSERT_EQ(rounded.lse[i], f32.lse[i]) << "lse " << i;
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(BothModels, DensePrefillSizesTest,
                         ::testing::Values(kDeepSeek, kGlm5),
                         [](const ::testing::TestParamInfo<SizePair>& info) {
                           return info.param.qk == 192 ? std::string("DeepSeekV32_192_128")
                                                       : std::string("Glm5_256_256");
                         });

// Graphs are cached: a second batch in the same buckets builds nothing.
TEST_F(DensePrefillTest, CudnnGraphsAreBuiltOncePerBucket) {
  cuda::CudnnSdpa* cudnn = RequireCudnn();
  if (cudnn == nullptr) GTEST_SKIP() << "cuDNN unavailable";
  Case c;
  c.heads = 8;
  c.seqs = {{100, 100}, {90, 120}};
  std::mt19937_64 rng(TestSeed());
  Outputs got;
  ASSERT_TRUE(Run(Impl::kCudnn, c, MakeInputs(c, rng), &got).ok());
  const int built = cudnn->num_graphs();
  c.seqs = {{110, 100}, {70, 127}};  // same buckets (batch 2, 128 / 128)
  const Inputs in = MakeInputs(c, rng);
  ASSERT_TRUE(Run(Impl::kCudnn, c, in, &got).ok());
  EXPECT_EQ(cudnn->num_graphs(), built);
  Check(c, in, got, rng);
}

// Prepare at plan time leaves Run nothing to build or allocate (the engine's contract: Run only
// enqueues, so it can be captured): a shape no earlier test used, prepared, then run; the graph
// count and the scratch stay as Prepare left them, and the result is right.
TEST_F(DensePrefillTest, PreparedShapeRunsWithoutBuildingOrAllocating) {
  cuda::CudnnSdpa* cudnn = RequireCudnn();
  if (cudnn == nullptr) GTEST_SKIP() << "cuDNN unavailable";
  Case c;
  c.heads = 24;  // a bucket of its own
  c.seqs = {{300, 700}, {1, 40}, {257, 257}};
  std::mt19937_64 rng(TestSeed());
  const Inputs in = MakeInputs(c, rng);
  DenseMhaParams p;  // sizes and strides as Run (below) passes them; no pointers
  p.dtype = DType::kBF16;
  p.out_dtype = DType::kF32;
  p.num_seqs = int(c.seqs.size());
  p.num_heads = c.heads, p.qk_dim = c.dims.qk, p.v_dim = c.dims.v;
  p.q_token_stride = p.k_token_stride = int64_t{c.heads} * c.dims.qk;
  p.q_head_stride = p.k_head_stride = c.dims.qk;
  p.v_token_stride = int64_t{c.heads} * c.dims.v;
  p.v_head_stride = c.dims.v;
  p.causal = true;
  const int graphs_before = cudnn->num_graphs();
  ASSERT_TRUE(cudnn->Prepare({p, in.cu_q.data(), in.cu_k.data()}).ok());
  EXPECT_EQ(cudnn->num_graphs(), graphs_before + 1);
  const size_t reserved = cudnn->scratch_bytes();
  Outputs got;
  const absl::Status status = Run(Impl::kCudnn, c, in, &got);
  ASSERT_TRUE(status.ok()) << status;
  EXPECT_EQ(cudnn->num_graphs(), graphs_before + 1) << "Run built a graph";
  EXPECT_EQ(cudnn->scratch_bytes(), reserved) << "Run grew the scratch";
  Check(c, in, got, rng);
}

// More sequences than a grid dimension holds: cuDNN declines them (Unimplemented, nothing
// written, so `auto` runs the native kernel, which splits them over launches: its test is
// DenseMhaCudaTest.MoreSequencesThanOneLaunchHolds).
TEST_F(DensePrefillTest, CudnnDeclinesMoreSequencesThanAGridHolds) {
  if (RequireCudnn() == nullptr) GTEST_SKIP() << "cuDNN unavailable";
  Case c;
  c.heads = 1;
  for (int s = 0; s < 65536; ++s) c.seqs.push_back({1, 1 + s % 3});
  std::mt19937_64 rng(TestSeed());
  Outputs unused;
  const absl::Status declined = Run(Impl::kCudnn, c, MakeInputs(c, rng), &unused);
  EXPECT_EQ(declined.code(), absl::StatusCode::kUnimplemented) << declined;
}

// Without a GPU, creating the cuDNN backend is an error with a message, never a crash (CI).
TEST(CudnnSdpaWithoutGpuTest, CreateIsAClearError) {
  if (VisibleGpuCount() > 0) GTEST_SKIP() << "a GPU is visible";
  auto created = cuda::CudnnSdpa::Create(nullptr);
  ASSERT_FALSE(created.ok());
  EXPECT_FALSE(created.status().message().empty());
  std::cout << "without a GPU: " << created.status() << "\n";
}

}  // namespace
}  // namespace dcp::testing
