// Sparse top-k MQA on the GPU (attention_params.h, SparseMqaParams): bf16 q and latent cache,
// fp32 out and natural-log LSE. Compiled for head_dim 576 / v_dim 512 (DeepSeek-V3.2's
// [kv_c | k_pe] rows); other sizes, other dtypes and strides that are not multiples of 8
// elements (16 bytes) are InvalidArgument. Any num_heads >= 1 (the grid has ceil(H / 64) head
// blocks per token), any topk >= 0. Indices outside [0, num_slots) are skipped.
//
// Two kernels (SparseMqaParams::kernel): the warp-specialised wgmma kernel on sm_90
// (sparse_mqa_sm90_kernel.cuh, used by default there) and the mma.sync kernel of sm_80+
// (sparse_mqa_kernel.cuh, the fallback and the twin of the tests). Both walk only the token's
// valid keys when valid_counts is given, and split each token's key list over several CTAs
// when tokens x head blocks would leave SMs idle (split-KV; the partials go to
// params.workspace and are merged by LSE with MergeSplits, or, in the wgmma kernel, inside a
// thread-block cluster of the splits: SparseMqaParams::split_merge).
//
// kv_format kFp8DsMla reads 656-byte fp8_ds_mla rows directly (kv_row_stride 656 bytes, 16-byte
// aligned cache), dequantizing them on the way into shared memory; q stays bf16. Both kernels
// read them (the wgmma kernel's producer copies the raw rows into the bf16 tile and dequantizes
// in place); kernel 0 picks the wgmma kernel on sm_90 as for bf16 rows.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "absl/status/status.h"
#include "attention/attention_params.h"

namespace dcp::cuda {

struct SparseMqaSplit;

absl::Status SparseMqa(const SparseMqaParams& params, cudaStream_t stream);

// Whether the kernels are compiled for rows of head_dim (R + Dr) with v_dim (R) values: 576 /
// 512 only, DeepSeek-V3.2's and GLM-5's latent rows (InvalidArgument naming both otherwise).
// SparseMqa checks it on every call; an engine checks it at Create (Device::SparseMqaSupport).
absl::Status CheckSparseMqaSizes(int head_dim, int v_dim);

// The kernel SparseMqa runs for params.kernel on the current device: 1 (mma.sync) or 2 (wgmma).
int SparseMqaResolveKernel(const SparseMqaParams& params);

// The keys per token the choices below plan for: params.expected_keys where it is set (at most
// topk), else topk.
int SparseMqaPlannedKeys(const SparseMqaParams& params);

// The split count the launcher uses when params.num_splits == 0, for `kernel` (1 or 2) on a
// device with num_sms SMs, before the workspace limit: 1 when tokens x head blocks fill the SMs,
// else the count that minimises a time model fitted to H200 measurements (waves x (fixed +
// blocks per split x block time) + the merge's cost per split; ties: fewer splits), at most 64
// and at most one split per 64-key block (per pair for the wgmma kernel), for
// SparseMqaPlannedKeys keys a token.
int SparseMqaChooseSplits(const SparseMqaParams& params, int kernel, int num_sms);

// The split count and, for the wgmma kernel (kernel 2), the heads per CTA (16, 32 or 64;
// params.block_heads when it is set) that the launcher uses when params.num_splits == 0: the
// pair the same time model prefers. The mma.sync kernel's block is always 64 heads.
struct SparseMqaTiling {
  int splits = 1;
  int block_heads = 64;
};
SparseMqaTiling SparseMqaChooseTiling(const SparseMqaParams& params, int kernel, int num_sms);

// The wgmma kernel's consumer schedule when params.sm90_schedule is 0 (SparseMqaParams): 2
// (roles) for bf16 rows where each split walks at least two pairs of 64-key blocks, else 1
// (pairs). Measured on the H200 (docs/sparse_mqa_sm90.md, "The roles schedule"): roles is
// faster on every multi-pair shape and ~1 us slower for a decode token whose splits hold one
// pair each, where the two warpgroups scoring one block each finish the pair sooner.
int SparseMqaChooseSchedule(const SparseMqaParams& params, int splits);

// The wgmma kernel's grid when params.sm90_ctas is 0: one CTA per SM (persistent CTAs, each
// walking items; the producer prefetches its next item's Q rows and first pair into L2 and
// gathers them under the current item's epilogue) for roles-schedule launches of at least
// kPersistentMinWaves waves of items, else 0 (one CTA per item, which the hardware hands to
// whichever SM frees first: kept for decode launches and the pairs schedule). Measured on the
// H200 (docs/sparse_mqa_sm90.md, "What bounds the roles schedule"): 4096 tokens x 128 heads
// 3-15% faster at 2048 keys and 3-4% at 512, 1024 tokens within the spread.
inline constexpr int kPersistentMinWaves = 8;
int SparseMqaChoosePersistentCtas(bool roles, int64_t items, int num_sms);

// Bytes of params.workspace that `splits` splits need (0 for one split).
int64_t SparseMqaWorkspaceBytes(const SparseMqaParams& params, int splits);

// The kernels for one compiled (head_dim, v_dim) and cache row format; params already checked. Defined in sparse_mqa_kernel.cuh / sparse_mqa_sm90_kernel.cuh,
// instantiated in instantiations/.
template <int kHeadDim, int kVDim, KvCacheDType kFormat = KvCacheDType::kBF16>
absl::Status LaunchSparseMqa(const SparseMqaParams& params, const SparseMqaSplit& split,
                             cudaStream_t stream);
// The wgmma kernel's epilogue, one instantiation each: fp32 rows (the final rows at one split,
// else the split partials for MergeSplits), bf16 rows at one split (SparseMqaParams::out_bf16),
// or the split merge inside a thread-block cluster (SparseMqaSplit::cluster_merge).
// ChooseSm90Epilogue (sparse_mqa_work.cuh) picks one per launch.
enum class Sm90Epilogue { kF32 = 0, kBf16 = 1, kCluster = 2 };
// Launches the instantiation ChooseSm90Epilogue and SparseMqaSplit::roles pick (an Internal
// error for another). kRoles: the roles schedule (sparse_mqa_sm90_roles.cuh; bf16 rows, the
// fp32 and bf16 epilogues).
template <int kHeadDim, int kVDim, KvCacheDType kFormat = KvCacheDType::kBF16,
          Sm90Epilogue kEpilogue = Sm90Epilogue::kF32, bool kRoles = false>
absl::Status LaunchSparseMqaSm90(const SparseMqaParams& params, const SparseMqaSplit& split,
                                 cudaStream_t stream);
// How many thread-block clusters of `splits` CTAs of the wgmma kernel the current device holds
// at once (cudaOccupancyMaxActiveClusters; one CTA an SM): 0 where it holds none or splits is
// outside [2, 16]. The launcher merges the splits inside the cluster
// (SparseMqaSplit::cluster_merge) only when all of a launch's clusters fit at once: a second
// wave of clusters doubled the kernel's time on the H200 (8 decode tokens, 16 splits); by
// choice (SparseMqaParams::split_merge 0) only for one token of at most 16 heads.
// Cached per device and count.
template <int kHeadDim, int kVDim, KvCacheDType kFormat = KvCacheDType::kBF16>
int SparseMqaSm90MaxClusters(int splits);
// Whether the wgmma kernel was compiled for the current device (sm_90a code in the binary).
bool SparseMqaSm90Available();

}  // namespace dcp::cuda
