// Times the CUDA kernels against the two ceilings measured on the same card in the same run
// (a device-to-device copy, a large cuBLAS bf16 GEMM), on random data, with CUDA events:
// 3 warm-ups, then the median of `reps` runs. Prints one table; `--quick` shrinks the sizes.
// Numbers go to docs/PERFORMANCE.md. Not a test: exit code 1 only when a call fails.
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "attention/cuda/dense_mha.h"
#include "attention/cuda/gemm_cublas.h"
#include "attention/cuda/merge_states.h"
#include "attention/cuda/sparse_mqa.h"
#include "core/cuda/convert.h"
#include "workspace/cuda/rows_cuda.h"

namespace {

#define BENCH_CHECK(expr)                                                     \
  do {                                                                        \
    const auto bench_result_ = (expr);                                        \
    if (!::dcp_bench_ok(bench_result_)) {                                     \
      std::fprintf(stderr, "FAILED: %s at %s:%d\n", #expr, __FILE__, __LINE__); \
      std::exit(1);                                                           \
    }                                                                         \
  } while (0)

}  // namespace

bool dcp_bench_ok(cudaError_t code) {
  if (code != cudaSuccess) std::fprintf(stderr, "%s\n", cudaGetErrorString(code));
  return code == cudaSuccess;
}
bool dcp_bench_ok(const absl::Status& status) {
  if (!status.ok()) std::fprintf(stderr, "%s\n", std::string(status.message()).c_str());
  return status.ok();
}
bool dcp_bench_ok(cublasStatus_t code) { return code == CUBLAS_STATUS_SUCCESS; }

namespace {

// Median milliseconds of `reps` runs of `body` after 3 warm-ups.
double TimeMs(const std::function<void()>& body, int reps) {
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  for (int i = 0; i < 3; ++i) body();
  BENCH_CHECK(cudaDeviceSynchronize());
  std::vector<float> times;
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(start);
    body();
    cudaEventRecord(stop);
    BENCH_CHECK(cudaEventSynchronize(stop));
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    times.push_back(ms);
  }
  BENCH_CHECK(cudaGetLastError());
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::sort(times.begin(), times.end());
  return times[times.size() / 2];
}

void* DeviceRandom(size_t bytes, uint64_t seed, bool bf16_values = true) {
  void* data = nullptr;
  BENCH_CHECK(cudaMalloc(&data, bytes));
  // Random bf16 in [-1, 1): fill on the host in slices (keeps host memory small).
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> dist(-1.f, 1.f);
  const size_t slice = size_t(1) << 24;
  std::vector<uint16_t> host(slice);
  for (size_t offset = 0; offset < bytes; offset += slice * 2) {
    const size_t n = std::min(slice, (bytes - offset) / 2);
    for (size_t i = 0; i < n; ++i) {
      const float f = dist(rng);
      uint32_t word;
      std::memcpy(&word, &f, 4);
      host[i] = bf16_values ? uint16_t(word >> 16) : uint16_t(rng());
    }
    BENCH_CHECK(cudaMemcpy(static_cast<char*>(data) + offset, host.data(), n * 2,
                           cudaMemcpyHostToDevice));
  }
  return data;
}

struct Row {
  std::string name;
  double ms, tflops, gbps;
};

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  const int reps = quick ? 3 : 15;
  BENCH_CHECK(cudaSetDevice(0));
  cudaDeviceProp prop{};
  BENCH_CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device: %s, %d SMs, L2 %d MB\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20);
  std::vector<Row> rows;
  cudaStream_t stream = nullptr;

  // Ceiling 1: device-to-device copy, bytes read + written.
  {
    const size_t bytes = size_t(quick ? 256 : 2048) << 20;
    void* a = DeviceRandom(bytes, 1, false);
    void* b = nullptr;
    BENCH_CHECK(cudaMalloc(&b, bytes));
    const double ms = TimeMs([&] { cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice); }, reps);
    rows.push_back({"copy d2d " + std::to_string(bytes >> 20) + " MiB", ms, 0, 2.0 * bytes / ms / 1e6});
    cudaFree(a);
    cudaFree(b);
  }
  // Ceiling 2: cuBLAS bf16 GEMM, fp32 compute, bf16 out.
  {
    const int n = quick ? 4096 : 8192;
    void* a = DeviceRandom(size_t(n) * n * 2, 2);
    void* b = DeviceRandom(size_t(n) * n * 2, 3);
    void* c = nullptr;
    BENCH_CHECK(cudaMalloc(&c, size_t(n) * n * 2));
    cublasHandle_t handle;
    BENCH_CHECK(cublasCreate(&handle));
    dcp::GemmParams p;
    p.a = a;
    p.b = b;
    p.c = c;
    p.a_dtype = p.b_dtype = p.c_dtype = dcp::DType::kBF16;
    p.m = p.n = p.k = n;
    p.lda = p.ldb = p.ldc = n;
    const double ms = TimeMs([&] { BENCH_CHECK(dcp::cuda::Gemm(handle, p, stream)); }, reps);
    rows.push_back({"cublas bf16 gemm " + std::to_string(n) + "^3", ms, 2.0 * n * n * n / ms / 1e9, 0});
    cublasDestroy(handle);
    cudaFree(a);
    cudaFree(b);
    cudaFree(c);
  }
  // Sparse MQA at DeepSeek-V3.2 dims: H 128, topk 2048, 576/512.
  for (int tokens : {quick ? 128 : 1024, quick ? 128 : 4096}) {
    const int heads = 128, topk = 2048, d = 576, dv = 512;
    const int64_t slots = int64_t(1) << 20;
    void* q = DeviceRandom(size_t(tokens) * heads * d * 2, 4);
    void* kv = DeviceRandom(size_t(slots) * d * 2, 5);
    std::vector<int32_t> idx(size_t(tokens) * topk);
    std::mt19937_64 rng(6);
    std::uniform_int_distribution<int32_t> pick(0, int32_t(slots - 1));
    for (auto& i : idx) i = pick(rng);
    int32_t* d_idx = nullptr;
    float *out = nullptr, *lse = nullptr;
    BENCH_CHECK(cudaMalloc(&d_idx, idx.size() * 4));
    BENCH_CHECK(cudaMemcpy(d_idx, idx.data(), idx.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMalloc(&out, size_t(tokens) * heads * dv * 4));
    BENCH_CHECK(cudaMalloc(&lse, size_t(tokens) * heads * 4));
    dcp::SparseMqaParams p;
    p.q = q;
    p.kv_cache = kv;
    p.indices = d_idx;
    p.out = out;
    p.lse = lse;
    p.dtype = dcp::DType::kBF16;
    p.num_tokens = tokens;
    p.num_heads = heads;
    p.head_dim = d;
    p.v_dim = dv;
    p.topk = topk;
    p.num_slots = slots;
    p.q_token_stride = int64_t(heads) * d;
    p.q_head_stride = d;
    p.kv_row_stride = d;
    p.indices_token_stride = topk;
    p.out_token_stride = int64_t(heads) * dv;
    p.out_head_stride = dv;
    p.lse_token_stride = heads;
    p.scale = 0.072f;
    const double ms = TimeMs([&] { BENCH_CHECK(dcp::cuda::SparseMqa(p, stream)); }, reps);
    const double flops = double(tokens) * heads * topk * (d + dv) * 2;
    const double bytes = double(tokens) * topk * d * 2 + double(tokens) * heads * (d * 2 + dv * 4);
    rows.push_back({"sparse mqa T" + std::to_string(tokens) + " H128 k2048", ms, flops / ms / 1e9,
                    bytes / ms / 1e6});
    cudaFree(q);
    cudaFree(kv);
    cudaFree(d_idx);
    cudaFree(out);
    cudaFree(lse);
  }
  // Dense MHA 192/128: causal prefill, and a non-causal context chunk.
  struct MhaShape {
    const char* name;
    int seqs, len_q, len_k, heads;
    bool causal;
  };
  for (const MhaShape& s : {MhaShape{"dense mha causal 4x4096 H16", 4, 4096, 4096, 16, true},
                            MhaShape{"dense mha causal 16x1024 H16", 16, 1024, 1024, 16, true},
                            MhaShape{"dense mha chunk 4x(1024,8192) H16", 4, 1024, 8192, 16, false}}) {
    const int qk = 192, v = 128;
    const int64_t tq = int64_t(s.seqs) * s.len_q, tk = int64_t(s.seqs) * s.len_k;
    void* q = DeviceRandom(size_t(tq) * s.heads * qk * 2, 7);
    void* k = DeviceRandom(size_t(tk) * s.heads * qk * 2, 8);
    void* vv = DeviceRandom(size_t(tk) * s.heads * v * 2, 9);
    float *out = nullptr, *lse = nullptr;
    int32_t *cu_q = nullptr, *cu_k = nullptr;
    std::vector<int32_t> hq(s.seqs + 1), hk(s.seqs + 1);
    for (int i = 0; i <= s.seqs; ++i) {
      hq[i] = i * s.len_q;
      hk[i] = i * s.len_k;
    }
    BENCH_CHECK(cudaMalloc(&out, size_t(tq) * s.heads * v * 4));
    BENCH_CHECK(cudaMalloc(&lse, size_t(tq) * s.heads * 4));
    BENCH_CHECK(cudaMalloc(&cu_q, hq.size() * 4));
    BENCH_CHECK(cudaMalloc(&cu_k, hk.size() * 4));
    BENCH_CHECK(cudaMemcpy(cu_q, hq.data(), hq.size() * 4, cudaMemcpyHostToDevice));
    BENCH_CHECK(cudaMemcpy(cu_k, hk.data(), hk.size() * 4, cudaMemcpyHostToDevice));
    dcp::DenseMhaParams p;
    p.q = q;
    p.k = k;
    p.v = vv;
    p.out = out;
    p.lse = lse;
    p.cu_seqlens_q = cu_q;
    p.cu_seqlens_k = cu_k;
    p.dtype = dcp::DType::kBF16;
    p.num_seqs = s.seqs;
    p.num_heads = s.heads;
    p.qk_dim = qk;
    p.v_dim = v;
    p.max_seqlen_q = s.len_q;
    p.max_seqlen_k = s.len_k;
    p.q_token_stride = int64_t(s.heads) * qk;
    p.q_head_stride = qk;
    p.k_token_stride = int64_t(s.heads) * qk;
    p.k_head_stride = qk;
    p.v_token_stride = int64_t(s.heads) * v;
    p.v_head_stride = v;
    p.out_token_stride = int64_t(s.heads) * v;
    p.out_head_stride = v;
    p.lse_token_stride = s.heads;
    p.causal = s.causal;
    p.scale = 0.072f;
    const double ms = TimeMs([&] { BENCH_CHECK(dcp::cuda::DenseMha(p, stream)); }, reps);
    double pairs = 0;  // (query, key) pairs computed
    for (int i = 0; i < s.len_q; ++i) {
      pairs += s.causal ? std::min(s.len_k, s.len_k - s.len_q + i + 1) : s.len_k;
    }
    const double flops = pairs * s.seqs * s.heads * (qk + v) * 2;
    rows.push_back({s.name, ms, flops / ms / 1e9, 0});
    cudaFree(q);
    cudaFree(k);
    cudaFree(vv);
    cudaFree(out);
    cudaFree(lse);
    cudaFree(cu_q);
    cudaFree(cu_k);
  }
  // Paged gather of cache rows (576 bf16).
  {
    const int width = 576;
    const int64_t cache_rows = int64_t(1) << 20, n = int64_t(1) << (quick ? 16 : 19);
    void* cache = DeviceRandom(size_t(cache_rows) * width * 2, 10, false);
    void* out = nullptr;
    int32_t* idx = nullptr;
    BENCH_CHECK(cudaMalloc(&out, size_t(n) * width * 2));
    std::vector<int32_t> h(n);
    std::mt19937_64 rng(11);
    std::uniform_int_distribution<int32_t> pick(0, int32_t(cache_rows - 1));
    for (auto& i : h) i = pick(rng);
    BENCH_CHECK(cudaMalloc(&idx, n * 4));
    BENCH_CHECK(cudaMemcpy(idx, h.data(), n * 4, cudaMemcpyHostToDevice));
    dcp::GatherRowsParams p{cache, idx, out, dcp::DType::kBF16, n, cache_rows, width, width, width};
    const double ms = TimeMs([&] { BENCH_CHECK(dcp::cuda::GatherRows(p, stream)); }, reps);
    rows.push_back({"gather rows 576 bf16 x" + std::to_string(n), ms, 0,
                    2.0 * n * width * 2 / ms / 1e6});
    cudaFree(cache);
    cudaFree(out);
    cudaFree(idx);
  }

  const double copy_gbps = rows[0].gbps, gemm_tflops = rows[1].tflops;
  std::printf("\n%-36s %10s %10s %8s %10s %8s\n", "kernel", "ms", "TFLOP/s", "%gemm", "GB/s",
              "%copy");
  for (const Row& r : rows) {
    std::printf("%-36s %10.3f %10.1f %7.0f%% %10.0f %7.0f%%\n", r.name.c_str(), r.ms, r.tflops,
                100.0 * r.tflops / gemm_tflops, r.gbps, 100.0 * r.gbps / copy_gbps);
  }
  return 0;
}
