// A timeline of the sm_90a sparse MQA kernel's phases, for a build with -DDCP_SPARSE_MQA_TRACE
// only (a profiling build; without the macro everything here compiles to nothing). Marks are
// SM clock cycles (clock64) taken by one thread of a warpgroup after the event it names; each
// CTA also records %globaltimer at its start and end, so CTAs can be lined up. The launcher
// copies the marks of the launch numbered DCP_SPARSE_MQA_TRACE_LAUNCH (1-based, counted per
// kernel instantiation; default 5, i.e. after a few warm-up launches; the marks are cleared
// behind the launch before it) back after that launch
// and prints, per mark, its mean / min / max over the traced CTAs in ns from the CTA's start
// (cycles at the CTA's measured clock), and the first few CTAs in full, to stderr.
#pragma once

#include <cstdint>

#if defined(DCP_SPARSE_MQA_TRACE)
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>

#include "core/environment.h"
#endif

namespace dcp::cuda::sm90_trace {

// Mark slots of one CTA. Per pair p < kPairs: the consumer marks of WG w at
// kPairBase + (w * kPairs + p) * kPairMarks + event, the producer's at kProducerBase + p * 5 + i
// (i = 0: L0 freed and seen by the producer, 1-4: the halves L0, R1, R0, L1 issued).
enum Mark : int {
  kGlobalStart = 0,   // %globaltimer, ns
  kGlobalEnd = 1,     // %globaltimer, ns
  kClockStart = 2,    // clock64 at the kernel's first instruction
  kClockEnd = 3,      // clock64 after WG0's last store
  kInitDone = 4,      // after griddepcontrol.wait, the work and the mbarrier init (__syncthreads)
  kQReady = 5,        // WG0: the Q tile is in shared memory
  kSumDone = 6,       // WG0: after the row-sum exchange (the epilogue starts)
  kWg1End = 7,        // WG1: after its last store
  kProducerRegs = 8,  // the producer (bf16 rows) after its setmaxnreg.dec
  kConsumerRegs = 9,  // WG0 after its setmaxnreg.inc, before the Q tile
  kProducerBase = 10,
  kPairBase = kProducerBase + 5 * 4,
};
enum PairEvent : int {
  kFirstHalf = 0,   // its first half buffer has landed
  kSecondHalf = 1,  // its second half has landed (before the rope tile)
  kScores = 2,      // S = Q K^T retired
  kMaxShared = 3,   // after the row-max exchange
  kPShared = 4,     // after the P exchange
  kPvDone = 5,      // both PV products retired
};
constexpr int kPairs = 4;
// The roles schedule (sparse_mqa_sm90_roles.cuh) records blocks kRolesFirstBlock + i, i < kPairs,
// one block a "pair" slot: WG0 first half = L landed, PV retired = the previous block's PV,
// second half = R landed, S retired, max shared = P written, P shared = after its barrier;
// WG1 first half = R landed, second half = P ready, PV retired.
constexpr int kRolesFirstBlock = 8;
constexpr int kPairMarks = 6;
constexpr int kMarks = kPairBase + 2 * kPairs * kPairMarks;
constexpr int kCtas = 512;  // CTAs traced (the first ones by blockIdx.x)

#if defined(DCP_SPARSE_MQA_TRACE)
// One copy per translation unit (per kernel instantiation); the launcher of the same unit
// reads it.
static __device__ unsigned long long g_marks[kCtas][kMarks];

__device__ __forceinline__ void Record(int mark) {
  if (blockIdx.x >= kCtas) return;
  unsigned long long value;
  if (mark == kGlobalStart || mark == kGlobalEnd) {
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(value));
  } else {
    value = clock64();
  }
  g_marks[blockIdx.x][mark] = value;
}

static const char* MarkName(int mark, char* buffer, size_t size) {
  static const char* kFixed[] = {"global start",       "global end",
                                 "clock start",        "end (WG0)",
                                 "init done",          "Q ready (WG0)",
                                 "sums shared (WG0)",  "end (WG1)",
                                 "producer registers", "consumer registers (WG0)"};
  static const char* kEvents[] = {"first half", "second half", "S retired",
                                  "max shared", "P shared",    "PV retired"};
  if (mark < kProducerBase) return kFixed[mark];
  if (mark < kPairBase) {
    static const char* kSteps[] = {"L0 free seen", "L0 issued", "R1 issued", "R0 issued",
                                   "L1 issued"};
    snprintf(buffer, size, "producer pair %d %s", (mark - kProducerBase) / 5,
             kSteps[(mark - kProducerBase) % 5]);
    return buffer;
  }
  const int i = mark - kPairBase;
  snprintf(buffer, size, "WG%d pair %d %s", i / (kPairs * kPairMarks), i / kPairMarks % kPairs,
           kEvents[i % kPairMarks]);
  return buffer;
}

// Called by the launcher after each launch of its instantiation.
static void AfterLaunch(const char* name, unsigned grid, cudaStream_t stream) {
  static int launches = 0;
  static const int traced =
      static_cast<int>(EnvInteger("DCP_SPARSE_MQA_TRACE_LAUNCH", 5, 1, 1 << 30));
  static unsigned long long host[kCtas][kMarks];
  ++launches;
  if (launches == traced - 1) {
    // Stale marks of earlier launches (other shapes) must not show: clear them behind this one.
    unsigned long long* device_marks = nullptr;
    if (cudaGetSymbolAddress(reinterpret_cast<void**>(&device_marks), g_marks) == cudaSuccess) {
      cudaMemsetAsync(device_marks, 0, sizeof(host), stream);
    }
  }
  if (launches != traced) return;
  if (cudaStreamSynchronize(stream) != cudaSuccess ||
      cudaMemcpyFromSymbol(host, g_marks, sizeof(host)) != cudaSuccess) {
    fprintf(stderr, "sparse mqa trace: copy failed\n");
    return;
  }
  const int ctas = static_cast<int>(std::min<unsigned>(grid, kCtas));
  unsigned long long first_start = ~0ull, last_end = 0;
  double cycles_per_ns = 0;
  for (int b = 0; b < ctas; ++b) {
    first_start = std::min(first_start, host[b][kGlobalStart]);
    last_end = std::max(last_end, host[b][kGlobalEnd]);
    cycles_per_ns += double(host[b][kClockEnd] - host[b][kClockStart]) /
                     double(std::max(1ull, host[b][kGlobalEnd] - host[b][kGlobalStart]));
  }
  cycles_per_ns /= ctas;
  fprintf(stderr,
          "sparse mqa trace: %s launch %d, grid %u (%d traced), first start to last end %.2f us, "
          "clock %.3f GHz\n",
          name, launches, grid, ctas, (last_end - first_start) / 1000.0, cycles_per_ns);
  char buffer[64];
  fprintf(stderr, "%-32s %9s %9s %9s  (ns from the CTA's start)\n", "mark", "mean", "min", "max");
  for (int mark = kClockEnd; mark < kMarks; ++mark) {
    double sum = 0, low = 1e30, high = -1e30;
    int n = 0;
    for (int b = 0; b < ctas; ++b) {
      const unsigned long long value = host[b][mark];
      if (value == 0) continue;  // not reached (fewer pairs than marks)
      const double ns = double(value - host[b][kClockStart]) / cycles_per_ns;
      sum += ns;
      low = std::min(low, ns);
      high = std::max(high, ns);
      ++n;
    }
    if (n > 0) {
      fprintf(stderr, "%-32s %9.0f %9.0f %9.0f\n", MarkName(mark, buffer, sizeof(buffer)), sum / n,
              low, high);
    }
  }
  fprintf(stderr, "%-8s %12s %12s\n", "cta", "start ns", "end ns");
  for (int b = 0; b < std::min(ctas, 8); ++b) {
    fprintf(stderr, "%-8d %12.0f %12.0f\n", b, double(host[b][kGlobalStart] - first_start),
            double(host[b][kGlobalEnd] - first_start));
  }
}
#endif

}  // namespace dcp::cuda::sm90_trace

#if defined(DCP_SPARSE_MQA_TRACE)
#define DCP_SM90_TRACE(condition, mark)                   \
  do {                                                    \
    if (condition) ::dcp::cuda::sm90_trace::Record(mark); \
  } while (0)
#else
#define DCP_SM90_TRACE(condition, mark) \
  do {                                  \
  } while (0)
#endif
