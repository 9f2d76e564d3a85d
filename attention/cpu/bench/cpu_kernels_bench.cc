// GFLOP/s of the CPU attention kernels at DeepSeek-V3.2 widths (R = 512, Dr = 64, Dn = Dv = 128,
// qk 192) and a few batch sizes. Counters: GFLOP/s (flops counted as 2 per multiply-add, the
// softmax not counted) and, for the memory-bound merge, GB/s. Threads: DCP_CPU_THREADS or all.
#include <benchmark/benchmark.h>

#include <cmath>
#include <cstdint>
#include <random>
#include <vector>

#include "attention/cpu/attention_cpu.h"

namespace {

std::vector<float> RandomFloats(int64_t count, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> values(count);
  for (float& value : values) value = dist(rng);
  return values;
}

std::vector<dcp::bf16> ToBf16(const std::vector<float>& values) {
  std::vector<dcp::bf16> out(values.size());
  for (size_t i = 0; i < values.size(); ++i) out[i] = dcp::float_to_bf16(values[i]);
  return out;
}

void SetFlops(benchmark::State& state, double flops_per_iteration) {
  state.counters["GFLOP/s"] =
      benchmark::Counter(flops_per_iteration * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// Batched GEMM as the up-projections use it: batch = heads, [m, k] @ [k, n] per head.
// Args: m, n, k, batch, bf16 (0/1).
void BM_Gemm(benchmark::State& state) {
  const int m = state.range(0), n = state.range(1), k = state.range(2), batch = state.range(3);
  const bool use_bf16 = state.range(4) != 0;
  const std::vector<float> a = RandomFloats(int64_t{m} * k * batch, 1);
  const std::vector<float> b = RandomFloats(int64_t{k} * n * batch, 2);
  const std::vector<dcp::bf16> a16 = ToBf16(a), b16 = ToBf16(b);
  std::vector<float> c(int64_t{m} * n * batch);
  dcp::GemmParams p;
  p.a = use_bf16 ? static_cast<const void*>(a16.data()) : a.data();
  p.b = use_bf16 ? static_cast<const void*>(b16.data()) : b.data();
  p.a_dtype = p.b_dtype = use_bf16 ? dcp::DType::kBF16 : dcp::DType::kF32;
  p.c = c.data();
  p.m = m, p.n = n, p.k = k, p.batch = batch;
  p.lda = k, p.ldb = n, p.ldc = n;
  p.stride_a = int64_t{m} * k, p.stride_b = int64_t{k} * n, p.stride_c = int64_t{m} * n;
  for (auto _ : state) {
    if (!dcp::cpu::Gemm(p).ok()) state.SkipWithError("Gemm failed");
    benchmark::DoNotOptimize(c.data());
  }
  SetFlops(state, 2.0 * m * n * k * batch);
}
BENCHMARK(BM_Gemm)
    ->ArgNames({"m", "n", "k", "batch", "bf16"})
    ->Args({512, 512, 512, 1, 0})
    ->Args({1024, 1024, 1024, 1, 0})
    ->Args({1024, 1024, 1024, 1, 1})
    ->Args({256, 512, 128, 16, 0})  // absorb q_nope -> ql, 16 heads x 256 tokens
    ->Args({256, 128, 512, 16, 1})  // o_lat -> out through w_uv, bf16 storage
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Causal dense MHA, one sequence of L new tokens over L keys, qk 192 / v 128.
// Args: L, heads, bf16.
void BM_DenseMha(benchmark::State& state) {
  const int len = state.range(0), heads = state.range(1);
  const bool use_bf16 = state.range(2) != 0;
  const int qk = 192, dv = 128;
  const std::vector<float> q = RandomFloats(int64_t{len} * heads * qk, 3);
  const std::vector<float> k = RandomFloats(int64_t{len} * heads * qk, 4);
  const std::vector<float> v = RandomFloats(int64_t{len} * heads * dv, 5);
  const std::vector<dcp::bf16> q16 = ToBf16(q), k16 = ToBf16(k), v16 = ToBf16(v);
  std::vector<float> out(int64_t{len} * heads * dv), lse(int64_t{len} * heads);
  const int32_t cu[2] = {0, len};
  dcp::DenseMhaParams p;
  p.q = use_bf16 ? static_cast<const void*>(q16.data()) : q.data();
  p.k = use_bf16 ? static_cast<const void*>(k16.data()) : k.data();
  p.v = use_bf16 ? static_cast<const void*>(v16.data()) : v.data();
  p.dtype = use_bf16 ? dcp::DType::kBF16 : dcp::DType::kF32;
  p.out = out.data(), p.lse = lse.data();
  p.cu_seqlens_q = cu, p.cu_seqlens_k = cu;
  p.num_seqs = 1, p.num_heads = heads, p.qk_dim = qk, p.v_dim = dv;
  p.q_token_stride = p.k_token_stride = int64_t{heads} * qk;
  p.q_head_stride = p.k_head_stride = qk;
  p.v_token_stride = p.out_token_stride = int64_t{heads} * dv;
  p.v_head_stride = p.out_head_stride = dv;
  p.lse_token_stride = heads;
  p.causal = true;
  p.scale = 1.0f / std::sqrt(static_cast<float>(qk));
  for (auto _ : state) {
    if (!dcp::cpu::DenseMha(p).ok()) state.SkipWithError("DenseMha failed");
    benchmark::DoNotOptimize(out.data());
  }
  // Causal: L(L+1)/2 query-key pairs, each qk + dv multiply-adds.
  SetFlops(state, 2.0 * heads * (double(len) * (len + 1) / 2) * (qk + dv));
}
BENCHMARK(BM_DenseMha)
    ->ArgNames({"L", "heads", "bf16"})
    ->Args({512, 16, 0})
    ->Args({2048, 16, 0})
    ->Args({2048, 16, 1})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// Sparse MQA over a latent cache: head_dim 576, v_dim 512, topk selected slots per token.
// Args: tokens, heads, topk, bf16.
void BM_SparseMqa(benchmark::State& state) {
  const int tokens = state.range(0), heads = state.range(1), topk = state.range(2);
  const bool use_bf16 = state.range(3) != 0;
  const int head_dim = 576, v_dim = 512, num_slots = 8192;
  const std::vector<float> q = RandomFloats(int64_t{tokens} * heads * head_dim, 6);
  const std::vector<float> kv = RandomFloats(int64_t{num_slots} * head_dim, 7);
  const std::vector<dcp::bf16> q16 = ToBf16(q), kv16 = ToBf16(kv);
  std::vector<int32_t> indices(int64_t{tokens} * topk);
  std::mt19937 rng(8);
  for (int t = 0; t < tokens; ++t) {
    std::vector<int32_t> all(num_slots);
    for (int i = 0; i < num_slots; ++i) all[i] = i;
    std::shuffle(all.begin(), all.end(), rng);
    std::copy(all.begin(), all.begin() + topk, indices.begin() + int64_t{t} * topk);
  }
  std::vector<float> out(int64_t{tokens} * heads * v_dim), lse(int64_t{tokens} * heads);
  dcp::SparseMqaParams p;
  p.q = use_bf16 ? static_cast<const void*>(q16.data()) : q.data();
  p.kv_cache = use_bf16 ? static_cast<const void*>(kv16.data()) : kv.data();
  p.dtype = use_bf16 ? dcp::DType::kBF16 : dcp::DType::kF32;
  p.indices = indices.data(), p.out = out.data(), p.lse = lse.data();
  p.num_tokens = tokens, p.num_heads = heads, p.head_dim = head_dim, p.v_dim = v_dim;
  p.topk = topk, p.num_slots = num_slots;
  p.q_token_stride = int64_t{heads} * head_dim, p.q_head_stride = head_dim;
  p.kv_row_stride = head_dim, p.indices_token_stride = topk;
  p.out_token_stride = int64_t{heads} * v_dim, p.out_head_stride = v_dim;
  p.lse_token_stride = heads;
  p.scale = 1.0f / std::sqrt(192.0f);
  for (auto _ : state) {
    if (!dcp::cpu::SparseMqa(p).ok()) state.SkipWithError("SparseMqa failed");
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 2.0 * tokens * heads * double(topk) * (head_dim + v_dim));
}
BENCHMARK(BM_SparseMqa)
    ->ArgNames({"tokens", "heads", "topk", "bf16"})
    ->Args({1, 128, 2048, 0})  // one decode token, all heads of the group
    ->Args({4, 128, 2048, 1})
    ->Args({32, 16, 2048, 0})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

// MergeStates of two [T, H, 512] partials (memory-bound: GB/s is the figure that matters).
void BM_MergeStates(benchmark::State& state) {
  const int tokens = state.range(0), heads = state.range(1), dim = 512;
  const int64_t size = int64_t{tokens} * heads * dim, rows = int64_t{tokens} * heads;
  const std::vector<float> a = RandomFloats(size, 9), b = RandomFloats(size, 10);
  const std::vector<float> lse_a = RandomFloats(rows, 11), lse_b = RandomFloats(rows, 12);
  std::vector<float> out(size), lse(rows);
  dcp::MergeStatesParams p;
  p.out_a = a.data(), p.lse_a = lse_a.data(), p.out_b = b.data(), p.lse_b = lse_b.data();
  p.out = out.data(), p.lse = lse.data();
  p.num_tokens = tokens, p.num_heads = heads, p.dim = dim;
  for (auto _ : state) {
    if (!dcp::cpu::MergeStates(p).ok()) state.SkipWithError("MergeStates failed");
    benchmark::DoNotOptimize(out.data());
  }
  SetFlops(state, 3.0 * size);  // 2 multiplies + 1 add per element
  state.counters["GB/s"] =
      benchmark::Counter(12.0 * size * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}
BENCHMARK(BM_MergeStates)
    ->ArgNames({"tokens", "heads"})
    ->Args({16, 128})
    ->Args({256, 128})
    ->Unit(benchmark::kMillisecond)
    ->UseRealTime();

}  // namespace

BENCHMARK_MAIN();
