// Checks, kernel choice, split-KV and dispatch of the sparse MQA launcher; the kernels are in
// sparse_mqa_kernel.cuh (mma.sync) and sparse_mqa_sm90_kernel.cuh (wgmma).
#include <algorithm>
#include <cstdint>

#include "attention/cuda/merge_states.h"
#include "attention/cuda/sparse_mqa.h"
#include "attention/cuda/sparse_mqa_work.cuh"
#include "core/cuda/cuda_status.h"
#include "core/cuda/device_info.h"
#include "core/environment.h"

namespace dcp::cuda {
namespace {

constexpr int kBlockHeads = 64, kBlockKeys = 64;

bool Aligned16(const void* pointer) { return reinterpret_cast<uintptr_t>(pointer) % 16 == 0; }

int NumSms() {
  const int sms = CurrentDeviceSmCount();
  return sms > 0 ? sms : 132;  // unknown: the H200's
}

int BlockAlign(int kernel) { return kernel == 2 ? 2 : 1; }

// The wgmma producer's L2 prefetch distance in pairs (SparseMqaSplit::prefetch_pairs):
// DCP_SPARSE_MQA_PREFETCH_PAIRS = 0 (off) to 4, default 1.
int PrefetchPairs() {
  static const int pairs = static_cast<int>(EnvInteger("DCP_SPARSE_MQA_PREFETCH_PAIRS", 1, 0, 4));
  return pairs;
}

// DCP_SPARSE_MQA_PERSISTENT: unset (-1) the launcher chooses (SparseMqaChoosePersistentCtas),
// 0 one CTA per item, 1 one CTA per SM (for measurements).
int PersistentFromEnvironment() {
  static const int persistent =
      static_cast<int>(EnvInteger("DCP_SPARSE_MQA_PERSISTENT", -1, -1, 1));
  return persistent;
}

// Whether persistent CTAs prefetch their next item into L2 (SparseMqaSplit::
// prefetch_next_item): DCP_SPARSE_MQA_PREFETCH_NEXT = 0 (off) or 1 (default).
bool PrefetchNextItem() {
  static const bool next = EnvSwitch("DCP_SPARSE_MQA_PREFETCH_NEXT", true);
  return next;
}

// The wgmma kernel's rescale slack (SparseMqaSplit::rescale_slack): DCP_SPARSE_MQA_RESCALE_SLACK
// = 0 (rescale whenever the max grows) to 16, default 8.
float RescaleSlack() {
  static const float slack =
      static_cast<float>(EnvNumber("DCP_SPARSE_MQA_RESCALE_SLACK", 8, 0, 16));
  return slack;
}

// The wgmma kernel's consumer schedule when SparseMqaParams::sm90_schedule is 0, for
// measurements: DCP_SPARSE_MQA_SCHEDULE = 1 (pairs) or 2 (roles); 0 or unset: chosen
// (SparseMqaChooseSchedule).
int ScheduleFromEnvironment() {
  static const int schedule = static_cast<int>(EnvInteger("DCP_SPARSE_MQA_SCHEDULE", 0, 0, 2));
  return schedule;
}

// Whether split_merge 0 merges inside the cluster where it can: DCP_SPARSE_MQA_CLUSTER_MERGE=0
// sends it to the MergeSplits kernel (for measurements); default on.
bool ClusterMergeByDefault() {
  static const bool on = EnvSwitch("DCP_SPARSE_MQA_CLUSTER_MERGE", true);
  return on;
}

absl::Status Check(const SparseMqaParams& p) {
  DCP_CHECK_ARG(p.expected_keys >= 0, "SparseMqa: expected_keys %d is negative", p.expected_keys);
  DCP_CHECK_ARG(p.num_tokens >= 0 && p.num_heads >= 0 && p.topk >= 0 && p.num_slots >= 0,
                "SparseMqa: negative size (tokens %d, heads %d, topk %d, slots %d)", p.num_tokens,
                p.num_heads, p.topk, p.num_slots);
  // Slots are int32 indices, and the kernels' key counts are int: a larger cache or width
  // cannot be addressed (the engine and the launcher refuse both earlier, with these limits).
  DCP_CHECK_ARG(p.num_slots <= INT32_MAX, "SparseMqa: %d cache slots, at most 2^31 - 1",
                p.num_slots);
  DCP_CHECK_ARG(p.topk <= kMaxTopkWidth, "SparseMqa: top-k width %d, at most 2^20", p.topk);
  DCP_CHECK_ARG(p.dtype == DType::kBF16, "SparseMqa (CUDA): dtype must be BF16, got %s",
                dtype_name(p.dtype));
  DCP_RETURN_IF_ERROR(CheckKvCacheDTypeSupported(p.kv_format, "SparseMqa (CUDA)"));
  DCP_RETURN_IF_ERROR(CheckSparseMqaSizes(p.head_dim, p.v_dim));
  DCP_CHECK_ARG(
      p.block_heads == 0 || p.block_heads == 16 || p.block_heads == 32 || p.block_heads == 64,
      "SparseMqa: block_heads %d is not 0 (chosen), 16, 32 or 64", p.block_heads);
  DCP_CHECK_ARG(p.kernel >= 0 && p.kernel <= 2, "SparseMqa: kernel %d is not 0, 1 or 2", p.kernel);
  DCP_CHECK_ARG(p.sm90_ctas >= 0, "SparseMqa: sm90_ctas %d < 0", p.sm90_ctas);
  DCP_CHECK_ARG(p.sm90_schedule >= 0 && p.sm90_schedule <= 2,
                "SparseMqa: sm90_schedule %d is not 0, 1 or 2", p.sm90_schedule);
  DCP_CHECK_ARG(p.split_merge >= 0 && p.split_merge <= 2, "SparseMqa: split_merge %d is not 0, 1 or 2",
                p.split_merge);
  DCP_CHECK_ARG(p.split_merge != 2 || (p.sm90_ctas == 0 && p.deferred_merge == nullptr),
                "SparseMqa: split_merge 2 (in the cluster) excludes sm90_ctas and deferred_merge");
  if (p.num_tokens == 0 || p.num_heads == 0) return absl::OkStatus();
  DCP_CHECK_ARG(p.q != nullptr && (p.out != nullptr || p.out_bf16 != nullptr) && p.lse != nullptr,
                "SparseMqa: q, out (or out_bf16) and lse must not be null");
  DCP_CHECK_ARG(p.out_bf16 == nullptr || p.deferred_merge == nullptr,
                "SparseMqa: out_bf16 and deferred_merge exclude each other (the partials are fp32)");
  DCP_CHECK_ARG(p.num_heads <= 65535 * 64, "SparseMqa: %d heads is too many", p.num_heads);
  if (p.topk > 0) {
    DCP_CHECK_ARG(p.indices != nullptr, "SparseMqa: indices must not be null when topk > 0");
    DCP_CHECK_ARG(p.num_slots == 0 || p.kv_cache != nullptr,
                  "SparseMqa: kv_cache must not be null");
    DCP_CHECK_ARG(p.indices_token_stride >= p.topk, "SparseMqa: indices_token_stride %d < topk %d",
                  p.indices_token_stride, p.topk);
  }
  DCP_CHECK_ARG(Aligned16(p.q) && p.q_token_stride % 8 == 0 && p.q_head_stride % 8 == 0,
                "SparseMqa (CUDA): q must be 16-byte aligned with strides that are multiples of 8 "
                "(token %d, head %d)",
                p.q_token_stride, p.q_head_stride);
  DCP_CHECK_ARG(p.q_head_stride >= p.head_dim || p.num_heads == 1,
                "SparseMqa: q_head_stride %d < head_dim %d", p.q_head_stride, p.head_dim);
  if (p.kv_format == KvCacheDType::kFp8DsMla) {
    DCP_CHECK_ARG(p.kv_row_stride == fp8_ds_mla::kRowBytes,
                  "SparseMqa (CUDA): fp8_ds_mla rows are %d bytes, got a kv_row_stride of %d bytes",
                  fp8_ds_mla::kRowBytes, p.kv_row_stride);
    DCP_CHECK_ARG(Aligned16(p.kv_cache), "SparseMqa (CUDA): kv_cache must be 16-byte aligned");
  } else {
    DCP_CHECK_ARG(Aligned16(p.kv_cache) && p.kv_row_stride % 8 == 0 &&
                      (p.kv_row_stride >= p.head_dim || p.num_slots <= 1),
                  "SparseMqa (CUDA): kv_cache must be 16-byte aligned, row stride %d a multiple of "
                  "8 and >= head_dim",
                  p.kv_row_stride);
  }
  DCP_CHECK_ARG(p.out_head_stride >= p.v_dim || p.num_heads == 1,
                "SparseMqa: out_head_stride %d < v_dim %d", p.out_head_stride, p.v_dim);
  DCP_CHECK_ARG(p.lse_token_stride >= p.num_heads || p.num_tokens == 1,
                "SparseMqa: lse_token_stride %d < num_heads %d", p.lse_token_stride, p.num_heads);
  DCP_CHECK_ARG(p.num_splits >= 0, "SparseMqa: num_splits %d < 0", p.num_splits);
  DCP_CHECK_ARG(p.workspace_bytes >= 0, "SparseMqa: workspace_bytes %d < 0", p.workspace_bytes);
  return absl::OkStatus();
}

// The wgmma kernel's instantiation for this launch's epilogue (ChooseSm90Epilogue) and
// schedule (SparseMqaSplit::roles: bf16 rows, fp32 or bf16 epilogue).
template <KvCacheDType kFormat>
absl::Status LaunchSm90(const SparseMqaParams& params, const SparseMqaSplit& split,
                        cudaStream_t stream) {
  if constexpr (kFormat == KvCacheDType::kBF16) {
    if (split.roles) {
      switch (ChooseSm90Epilogue(params, split)) {
        case Sm90Epilogue::kBf16:
          return LaunchSparseMqaSm90<576, 512, kFormat, Sm90Epilogue::kBf16, true>(params, split,
                                                                                  stream);
        case Sm90Epilogue::kF32:
          return LaunchSparseMqaSm90<576, 512, kFormat, Sm90Epilogue::kF32, true>(params, split,
                                                                                 stream);
        case Sm90Epilogue::kCluster:
          break;
      }
      return DCP_ERROR(Internal, "SparseMqa (wgmma): no roles schedule with the cluster merge");
    }
  }
  switch (ChooseSm90Epilogue(params, split)) {
    case Sm90Epilogue::kCluster:
      return LaunchSparseMqaSm90<576, 512, kFormat, Sm90Epilogue::kCluster>(params, split, stream);
    case Sm90Epilogue::kBf16:
      return LaunchSparseMqaSm90<576, 512, kFormat, Sm90Epilogue::kBf16>(params, split, stream);
    case Sm90Epilogue::kF32:
      break;
  }
  return LaunchSparseMqaSm90<576, 512, kFormat, Sm90Epilogue::kF32>(params, split, stream);
}

}  // namespace

int SparseMqaResolveKernel(const SparseMqaParams& params) {
  if (params.kernel == 1 || params.kernel == 2) return params.kernel;
  // Both kernels read bf16 and fp8_ds_mla rows.
  return SparseMqaSm90Available() ? 2 : 1;
}

int SparseMqaPlannedKeys(const SparseMqaParams& p) {
  const int topk = std::max(p.topk, 0);
  return p.expected_keys > 0 ? std::min(p.expected_keys, topk) : topk;
}

SparseMqaTiling SparseMqaChooseTiling(const SparseMqaParams& p, int kernel, int num_sms) {
  // Ties keep the first candidate: 64 heads, then fewer splits.
  SparseMqaTiling best;
  const int keys = SparseMqaPlannedKeys(p);
  if (p.num_tokens <= 0 || p.num_heads <= 0 || keys <= 0 || num_sms <= 0) return best;
  const int align = BlockAlign(kernel);
  const int blocks = (keys + kBlockKeys - 1) / kBlockKeys;
  const int most = std::max(1, std::min(kMaxMergeSplits, blocks / align));
  // Modelled time in microseconds, fitted to H200 measurements of one decode token at 128 heads
  // (docs/sparse_mqa_sm90.md, v2): one CTA per SM; a CTA costs `fixed` (launch, Q tile, first
  // gather, epilogue, the merge's latency) plus `block` per 64-key block; each split adds its
  // partial's traffic (written once, read once by the merge, about 3 TB/s). A CTA of 32 heads
  // (the wgmma kernel) moves a smaller Q tile and half the partial: 1.5 us less fixed cost
  // (measured at 1, 4 and 16 tokens, docs/sparse_mqa_sm90.md, "Heads per CTA"); 16 heads
  // measured no better than 32, so the model does not offer it.
  const double block = kernel == 2 ? 2.2 : 6.2, fixed = kernel == 2 ? 15.5 : 21.0;
  const double rows = double(p.num_tokens) * p.num_heads;
  const double merge_per_split = 2.0 * rows * p.v_dim * 4 / 3.0e6;
  // The candidates: the mma.sync kernel's 64-head block; the wgmma kernel's forced
  // block_heads, else 64 and 32.
  auto offered = [&](int block_heads) {
    if (kernel != 2) return block_heads == kBlockHeads;
    if (p.block_heads > 0) return block_heads == p.block_heads;
    return block_heads != 16;
  };
  double best_cost = -1;
  for (int block_heads : {64, 32, 16}) {
    if (!offered(block_heads)) continue;
    const double cta_fixed = fixed - (block_heads == 32 ? 1.5 : block_heads == 16 ? 2.0 : 0.0);
    const int64_t base = int64_t(p.num_tokens) * ((p.num_heads + block_heads - 1) / block_heads);
    for (int splits = 1; splits <= (base >= num_sms ? 1 : most); ++splits) {
      int per = (blocks + splits - 1) / splits;
      per = (per + align - 1) / align * align;
      const int64_t waves = (base * splits + num_sms - 1) / num_sms;
      const double cost =
          double(waves) * (per * block + cta_fixed) + (splits > 1 ? splits * merge_per_split : 0.0);
      if (best_cost < 0 || cost < best_cost) {
        best = {splits, block_heads};
        best_cost = cost;
      }
    }
  }
  return best;
}

int SparseMqaChooseSplits(const SparseMqaParams& p, int kernel, int num_sms) {
  return SparseMqaChooseTiling(p, kernel, num_sms).splits;
}

int SparseMqaChooseSchedule(const SparseMqaParams& p, int splits) {
  if (p.kv_format != KvCacheDType::kBF16) return 1;
  const int64_t blocks = (int64_t{SparseMqaPlannedKeys(p)} + 63) / 64;
  const int64_t per_split = (blocks + std::max(splits, 1) - 1) / std::max(splits, 1);
  const int64_t pairs = (per_split + 1) / 2;
  return pairs >= 2 ? 2 : 1;
}

int SparseMqaChoosePersistentCtas(bool roles, int64_t items, int num_sms) {
  return roles && num_sms > 0 && items >= int64_t{kPersistentMinWaves} * num_sms ? num_sms : 0;
}

int64_t SparseMqaWorkspaceBytes(const SparseMqaParams& p, int splits) {
  if (splits <= 1) return 0;
  const int64_t rows = int64_t(splits) * p.num_tokens * p.num_heads;
  return rows * p.v_dim * 4 + (rows * 4 + 255) / 256 * 256;
}

absl::Status CheckSparseMqaSizes(int head_dim, int v_dim) {
  DCP_CHECK_ARG(head_dim == 576 && v_dim == 512,
                "the CUDA sparse MQA kernels are compiled for latent rows of 576 (kv_lora_rank + "
                "qk_rope_head_dim) with 512 values (kv_lora_rank), DeepSeek-V3.2's and GLM-5's; "
                "this model has %d / %d",
                head_dim, v_dim);
  return absl::OkStatus();
}

absl::Status SparseMqa(const SparseMqaParams& params, cudaStream_t stream) {
  DCP_RETURN_IF_ERROR(Check(params));
  if (params.deferred_merge != nullptr) *params.deferred_merge = {};  // out written, unless below
  if (params.num_tokens == 0 || params.num_heads == 0) return absl::OkStatus();
  if (params.head_dim != 576 || params.v_dim != 512) {
    return DCP_ERROR(InvalidArgument, "SparseMqa (CUDA): no kernel for head_dim %d / v_dim %d",
                     params.head_dim, params.v_dim);
  }
  const int kernel = SparseMqaResolveKernel(params);
  if (kernel == 2 && !SparseMqaSm90Available()) {
    return DCP_ERROR(Unimplemented,
                     "SparseMqa (CUDA): the wgmma kernel needs an sm_90 device and a build for "
                     "sm_90a (CMAKE_CUDA_ARCHITECTURES=90a)");
  }
  const SparseMqaTiling tiling = SparseMqaChooseTiling(params, kernel, NumSms());
  int splits = params.num_splits > 0 ? std::min(params.num_splits, kMaxMergeSplits) : tiling.splits;
  const int64_t room = params.workspace == nullptr ? 0 : params.workspace_bytes;
  while (splits > 1 && SparseMqaWorkspaceBytes(params, splits) > room) --splits;
  SparseMqaSplit split;
  split.num_splits = splits;
  split.block_heads = kernel == 2 ? tiling.block_heads : kBlockHeads;
  split.prefetch_pairs = PrefetchPairs();
  split.rescale_slack = RescaleSlack();
  // The grid in two steps: a forced one (params.sm90_ctas, DCP_SPARSE_MQA_PERSISTENT=1) here,
  // since it rules out the cluster merge below; a chosen one after the schedule, which it depends
  // on and which depends on the cluster merge.
  if (kernel == 2 && params.sm90_ctas > 0) split.persistent_ctas = params.sm90_ctas;
  if (kernel == 2 && params.sm90_ctas == 0 && PersistentFromEnvironment() == 1) {
    split.persistent_ctas = NumSms();
  }
  split.prefetch_next_item = PrefetchNextItem();
  if (splits > 1) {
    DCP_CHECK_ARG(Aligned16(params.workspace), "SparseMqa: workspace must be 16-byte aligned");
    const int64_t rows = int64_t(splits) * params.num_tokens * params.num_heads;
    split.part_out = static_cast<float*>(params.workspace);
    split.part_lse = split.part_out + rows * params.v_dim;
  }
  // The splits merged inside the wgmma kernel, one cluster a (token, head block). Required
  // (split_merge 2): wherever a cluster of `splits` CTAs runs at all. Chosen (0): only where it
  // was measured faster (H200, docs/sparse_mqa_sm90.md, "The merge inside a cluster"): one token
  // of at most 16 heads (the decode layer 0.7-1.4 us faster replayed, five A/B pairs); at 32
  // heads, 2-4 tokens and 128 heads the layer was 0.4-1.9 us slower or no faster and the kernel
  // alone slower. Either way every cluster must be held at once (a second wave of clusters
  // doubled the kernel's time).
  const bool cluster_wanted =
      splits > 1 && (params.split_merge == 2 ||
                     (params.split_merge == 0 && params.num_tokens == 1 &&
                      params.num_heads <= 16 && ClusterMergeByDefault()));
  if (cluster_wanted) {
    const bool fp8 = params.kv_format == KvCacheDType::kFp8DsMla;
    const int held = kernel != 2 || split.persistent_ctas > 0 || params.deferred_merge != nullptr
                         ? 0
                     : fp8 ? SparseMqaSm90MaxClusters<576, 512, KvCacheDType::kFp8DsMla>(splits)
                           : SparseMqaSm90MaxClusters<576, 512>(splits);
    const int64_t clusters = int64_t(params.num_tokens) *
                             ((params.num_heads + split.block_heads - 1) / split.block_heads);
    if (params.split_merge == 2 && held == 0) {
      return DCP_ERROR(Unimplemented,
                       "SparseMqa: split_merge 2 needs the wgmma kernel, a grid that is not "
                       "persistent and a device that fits a cluster of %d CTAs",
                       splits);
    }
    split.cluster_merge = params.split_merge == 2 || (held > 0 && clusters <= held);
  }
  // The roles schedule where it is compiled (bf16 rows, not the cluster merge) and asked for or
  // chosen.
  int schedule = params.sm90_schedule > 0 ? params.sm90_schedule : ScheduleFromEnvironment();
  if (schedule == 0) schedule = SparseMqaChooseSchedule(params, splits);
  split.roles = kernel == 2 && schedule == 2 && params.kv_format == KvCacheDType::kBF16 &&
                !split.cluster_merge;
  if (kernel == 2 && params.sm90_ctas == 0 && PersistentFromEnvironment() == -1) {
    split.persistent_ctas = SparseMqaChoosePersistentCtas(
        split.roles, SparseMqaItems(params, split.num_splits, split.block_heads), NumSms());
  }
  if (kernel == 2 && params.kv_format == KvCacheDType::kFp8DsMla) {
    DCP_RETURN_IF_ERROR(LaunchSm90<KvCacheDType::kFp8DsMla>(params, split, stream));
  } else if (kernel == 2) {
    DCP_RETURN_IF_ERROR(LaunchSm90<KvCacheDType::kBF16>(params, split, stream));
  } else if (params.kv_format == KvCacheDType::kFp8DsMla) {
    DCP_RETURN_IF_ERROR(
        (LaunchSparseMqa<576, 512, KvCacheDType::kFp8DsMla>(params, split, stream)));
  } else {
    DCP_RETURN_IF_ERROR((LaunchSparseMqa<576, 512>(params, split, stream)));
  }
  if (splits == 1 || split.cluster_merge) return absl::OkStatus();
  if (params.deferred_merge != nullptr) {
    // The caller merges (GemmParams::merge_a): out and lse stay unwritten.
    *params.deferred_merge = {splits, split.part_out, split.part_lse};
    return absl::OkStatus();
  }
  const bool bf16_out = params.out_bf16 != nullptr;
  return MergeSplits(split.part_out, split.part_lse, splits, params.num_tokens, params.num_heads,
                     params.v_dim, bf16_out ? params.out_bf16 : params.out,
                     params.out_token_stride, params.out_head_stride, params.lse,
                     params.lse_token_stride, stream, bf16_out);
}

}  // namespace dcp::cuda
