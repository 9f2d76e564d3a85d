// The split merge of the sm_90a sparse MQA kernel inside a thread-block cluster
// (SparseMqaSplit::cluster_merge). The CTAs of one (token, head block) are the splits of its key
// list, launched as one cluster of num_splits CTAs (cluster rank = split). Each CTA stages its
// normalised partial O (fp32, 64 rows x 512 at kClusterStagePitch floats a row, in the K
// buffers) and its partial LSEs (in P1) in its own shared memory: both free once the last pair's
// wgmmas have retired (kBarSum). After a cluster barrier, CTA `split` merges rows
// [split * per, (split + 1) * per) of the head block (per = ceil(heads / splits)) from every
// CTA's shared memory (ld.shared::cluster) by MergeSplits' rule and in its order (one group of
// up to 16 splits: the same bits as the MergeSplits kernel on the same partials), and writes the
// final out (fp32) or out_bf16, and lse. A second cluster barrier (each thread arrives after
// its last read, waits before it exits) keeps every CTA's shared memory alive until its
// readers are done. The producer warpgroup has exited by then; exited
// threads do not hold a cluster barrier.
// What it replaces: the partials' round trip through global memory (128 KiB a CTA) and the
// MergeSplits launch after the grid (~4 us after the attention kernel in the one-token decode
// layer). Measured on the H200 (docs/sparse_mqa_sm90.md, "The merge inside a cluster, rebuilt
// and measured at the layer"): the
// merge inside the kernel costs nearly as long (~3-4 us: the cluster barriers wait for the
// slowest split, the reads cross SMs), so the one-token layer gains 0.7-1.4 us at 16 heads and
// loses elsewhere (32 heads, 2-4 tokens, 128 heads); the launcher picks it only for one token
// of at most 16 heads.
#pragma once

#include <cuda_bf16.h>

#include <cstdint>

#include "attention/attention_params.h"
#include "attention/cuda/lse_merge.cuh"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "attention/cuda/wgmma_sm90.cuh"

namespace dcp::cuda {

// Splits a cluster merge takes: 16 is the largest cluster Hopper allows (non-portable above 8).
constexpr int kSparseMqaMaxClusterSplits = 16;
// Row pitch of the staged partial in floats: 512 + 8, so that the 16 lanes of a half-warp's
// 8-byte stores (4 rows x 32 bytes) fall on distinct banks.
constexpr int kClusterStagePitch = 520;

namespace sm90 {

// The two halves of a cluster barrier: arrive (release: this thread's shared-memory writes
// become visible to the cluster) and wait (acquire) for every non-exited thread's arrival.
__device__ __forceinline__ void ClusterArrive() {
  asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
}
__device__ __forceinline__ void ClusterWait() {
  asm volatile("barrier.cluster.wait.acquire;\n" ::: "memory");
}

// The shared::cluster address of `address` (this CTA's shared memory) in CTA `rank`'s.
__device__ __forceinline__ uint32_t MapShared(uint32_t address, uint32_t rank) {
  uint32_t mapped;
  asm volatile("mapa.shared::cluster.u32 %0, %1, %2;\n" : "=r"(mapped) : "r"(address), "r"(rank));
  return mapped;
}

__device__ __forceinline__ float LdCluster(uint32_t address) {
  float v;
  asm volatile("ld.shared::cluster.f32 %0, [%1];\n" : "=f"(v) : "r"(address) : "memory");
  return v;
}

__device__ __forceinline__ float4 LdCluster128(uint32_t address) {
  float4 v;
  asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];\n"
               : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
               : "r"(address)
               : "memory");
  return v;
}

// Run by the 256 consumer threads (thread = 0..255) of every CTA of the cluster, after each has
// staged its partial and arrived at the cluster barrier (ClusterArrive; this function waits). stage /
// stage_lse: this CTA's staged partial ([64][kClusterStagePitch] fp32) and LSEs ([64]) as
// shared-window addresses (the same offsets in every CTA). A unit (4 values of a row) loads its
// row's LSEs and values from every split at once (one round trip; an empty split's staged
// values are zeros, loaded and never multiplied). The function arrives at the second cluster
// barrier as soon as its reads are done, stores, then waits: the barrier overlaps the stores.
// Not inlined: its registers are its own, so the kernel's main loop is allocated as without it.
// out_bf16: SparseMqaParams::out_bf16 at this item's (token, head0) row, or null (w.out).
inline __device__ __noinline__ void ClusterMergeSplits(SparseMqaWork w, __nv_bfloat16* out_bf16,
                                                int64_t out_head_stride, int splits,
                                                uint32_t stage, uint32_t stage_lse, int thread) {
  constexpr int kGroup = kSparseMqaMaxClusterSplits;
  static_assert(kGroup == kLseMergeGroup, "one group, as MergeSplitsKernel merges it");
  constexpr int kChunks = 512 / 4;  // 4 values a unit
  const int per = (w.heads + splits - 1) / splits;
  const int row0 = w.split * per;
  const int rows = max(0, min(w.heads, row0 + per) - row0);
  uint32_t peer[kGroup], peer_lse[kGroup];
#pragma unroll
  for (int k = 0; k < kGroup; ++k) {
    peer[k] = k < splits ? MapShared(stage, k) : 0u;
    peer_lse[k] = k < splits ? MapShared(stage_lse, k) : 0u;
  }
  const bool to_bf16 = out_bf16 != nullptr;
  // ceil(rows * 128 / 256) units a thread (1 at 16 splits of 32 heads, 16 at 2 splits of 64).
  ClusterWait();
  int unit = thread;
  for (; unit < rows * kChunks; unit += 256) {
    const int row = row0 + unit / kChunks, d = (unit % kChunks) * 4;
    float l[kGroup];
    float4 v[kGroup];
    const uint32_t offset = 4u * uint32_t(row * kClusterStagePitch + d);
#pragma unroll
    for (int k = 0; k < kGroup; ++k) {
      l[k] = k < splits ? SanitizeLse(LdCluster(peer_lse[k] + 4u * uint32_t(row)))
                        : -INFINITY;
      v[k] = k < splits ? LdCluster128(peer[k] + offset) : make_float4(0.f, 0.f, 0.f, 0.f);
    }
    // The last unit's reads are done: let the cluster go on (this CTA stays until the wait).
    if (unit + 256 >= rows * kChunks) ClusterArrive();
    // MergeSplitsKernel's arithmetic on its first (here only) group: the same bits.
    LseMerge4 merge;
    merge.AddGroup(l, v);
    const float4 r = merge.Values();
    if (to_bf16) {
      __nv_bfloat16* out = out_bf16 + int64_t(row) * out_head_stride + d;
      StoreMerged4(out, 0, true, reinterpret_cast<uintptr_t>(out) % 8 == 0, r);
    } else {
      float* out = w.out + int64_t(row) * w.out_head_stride + d;
      StoreMerged4(out, 0, false, reinterpret_cast<uintptr_t>(out) % 16 == 0, r);
    }
    if (d == 0) w.lse[row] = merge.Lse();
  }
  // A thread without units arrives here; every thread then waits until no peer reads this
  // CTA's stage any more.
  if (thread >= rows * kChunks) ClusterArrive();
  ClusterWait();
}

}  // namespace sm90
}  // namespace dcp::cuda
