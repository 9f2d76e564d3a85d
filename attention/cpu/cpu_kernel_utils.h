// Helpers shared by the CPU kernels of this folder only: the thread split, the ISA dispatch of
// the hot loops and a vectorizable exp. Not part of the public API.
#pragma once

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <thread>
#include <vector>

#include "core/dtype.h"
#include "core/environment.h"

// The hot loops are compiled for AVX-512, AVX2+FMA and baseline x86-64 and picked at load time
// (GCC function multi-versioning), so the library stays portable without -march=native.
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define DCP_CPU_MULTIVERSION \
  __attribute__((target_clones("arch=x86-64-v4", "arch=x86-64-v3", "default")))
#else
#define DCP_CPU_MULTIVERSION
#endif

namespace dcp::cpu::internal {

inline constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Threads used by the kernels: the machine's cores, or DCP_CPU_THREADS when set (>= 1), read
// once. The override exists for the benchmarks' per-core figures.
inline int NumThreads() {
  static const int threads = [] {
    const int64_t set = EnvInteger("DCP_CPU_THREADS", 0, 1, 4096);
    return set > 0 ? static_cast<int>(set)
                   : std::max(1, static_cast<int>(std::thread::hardware_concurrency()));
  }();
  return threads;
}

// Below this many flops (or bytes for the memory-bound merges) a thread start costs more than
// it saves.
inline constexpr double kMinParallelWork = 1 << 20;

// Runs fn(begin, end) over chunks of [0, n). With enough total work the chunks are handed out
// dynamically to NumThreads() threads (the causal and ragged tasks are uneven); otherwise the
// caller's thread does all of it. fn must not throw.
template <typename Fn>
void ParallelFor(int64_t n, double total_work, Fn&& fn) {
  if (n <= 0) return;
  const int threads = static_cast<int>(std::min<int64_t>(NumThreads(), n));
  if (threads <= 1 || total_work < kMinParallelWork) {
    fn(int64_t{0}, n);
    return;
  }
  const int64_t grain = std::max<int64_t>(1, n / (int64_t{threads} * 8));
  std::atomic<int64_t> next{0};
  auto worker = [&] {
    for (;;) {
      const int64_t begin = next.fetch_add(grain, std::memory_order_relaxed);
      if (begin >= n) return;
      fn(begin, std::min(n, begin + grain));
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(threads - 1);
  for (int i = 1; i < threads; ++i) pool.emplace_back(worker);
  worker();
  for (std::thread& thread : pool) thread.join();
}

inline bool IsFloatDType(DType dtype) { return dtype == DType::kF32 || dtype == DType::kBF16; }

// exp(x) in fp32 without a libm call, so loops over it vectorize: x = n*ln2 + r, Cephes' expf
// polynomial for e^r (about 1 ulp), 2^n built in the exponent bits. Anything below -87 (masked
// keys, -inf) gives exactly 0; callers only pass x <= 0 (max-subtracted logits).
inline float FastExp(float x) {
  const float clamped = std::min(std::max(x, -87.0f), 88.0f);
  const float n = std::floor(clamped * 1.44269504088896341f + 0.5f);
  float r = clamped - n * 0.693359375f;
  r = r - n * -2.12194440e-4f;
  float poly = 1.9875691500e-4f;
  poly = poly * r + 1.3981999507e-3f;
  poly = poly * r + 8.3334519073e-3f;
  poly = poly * r + 4.1665795894e-2f;
  poly = poly * r + 1.6666665459e-1f;
  poly = poly * r + 5.0000001201e-1f;
  const float e_r = poly * r * r + r + 1.0f;
  const float two_n = std::bit_cast<float>((static_cast<int32_t>(n) + 127) << 23);
  return x < -87.0f ? 0.0f : e_r * two_n;
}

}  // namespace dcp::cpu::internal
