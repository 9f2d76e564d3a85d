#include "runtime/lse_combine.h"

#include "core/status.h"

namespace dcp {

absl::Status LseCombine::Prepare(int64_t tx, int hl, int dim) {
  const int world = comm_.world_size();
  if (world == 1) return absl::OkStatus();
  const size_t part_count = size_t(tx) * hl * dim, lse_count = size_t(tx) * hl;
  if (backend_ == CombineBackend::kAllGatherReduceScatter) {
    DCP_RETURN_IF_ERROR(comm_.ReserveReduceScatter(part_count, DType::kF32));
    DCP_RETURN_IF_ERROR(lse_all_.Reserve(device_, lse_count * world * world * 4).status());
    return lse_total_.Reserve(device_, lse_count * world * 4).status();
  }
  DCP_RETURN_IF_ERROR(received_.Reserve(device_, part_count * world * 4).status());
  return lse_received_.Reserve(device_, lse_count * world * 4).status();
}

absl::Status LseCombine::Run(float* partial, const float* lse_partial, int64_t tx, int hl,
                             int dim, float* combined, float* lse, StepStats* stats) {
  const int world = comm_.world_size();
  const size_t part_count = size_t(tx) * hl * dim, lse_count = size_t(tx) * hl;
  DCP_CHECK_ARG(world > 1, "the LSE combine of a group of one (its partials are the result)");
  if (backend_ == CombineBackend::kAllGatherReduceScatter) {
    DCP_ASSIGN_OR_RETURN(void* lse_all, lse_all_.Get(lse_count * world * world * 4));
    DCP_ASSIGN_OR_RETURN(void* lse_total, lse_total_.Get(lse_count * world * 4));
    PhaseTimer comm_timer(stats);
    DCP_RETURN_IF_ERROR(comm_.AllGather(lse_partial, lse_all, lse_count * world, DType::kF32));
    comm_timer.End(&ForwardStats::combine_comm_s);
    // The [W, T, Hl] grid is T' = W*T tokens for the correction.
    DcpCorrectParams correct;
    correct.out = partial;
    correct.lse_all = static_cast<const float*>(lse_all);
    correct.lse_total = static_cast<float*>(lse_total);
    correct.world_size = world;
    correct.rank = comm_.rank();
    correct.num_tokens = static_cast<int>(tx * world);
    correct.num_heads = hl;
    correct.dim = dim;
    DCP_RETURN_IF_ERROR(device_.DcpCorrect(correct));
    comm_timer.Restart();
    DCP_RETURN_IF_ERROR(comm_.ReduceScatterSum(partial, combined, part_count, DType::kF32));
    comm_timer.End(&ForwardStats::combine_comm_s);
    DCP_RETURN_IF_ERROR(device_.Copy(
        lse, static_cast<float*>(lse_total) + size_t(comm_.rank()) * lse_count, lse_count * 4));
    if (stats) {
      stats->combine_bytes +=
          int64_t(lse_count) * world * world * 4 + int64_t(part_count) * world * 4;
    }
    return absl::OkStatus();
  }
  DCP_ASSIGN_OR_RETURN(void* received, received_.Get(part_count * world * 4));
  DCP_ASSIGN_OR_RETURN(void* lse_received, lse_received_.Get(lse_count * world * 4));
  PhaseTimer comm_timer(stats);
  DCP_RETURN_IF_ERROR(comm_.AllToAll(partial, received, part_count, DType::kF32));
  DCP_RETURN_IF_ERROR(comm_.AllToAll(lse_partial, lse_received, lse_count, DType::kF32));
  comm_timer.End(&ForwardStats::combine_comm_s);
  DcpCombineParams combine;
  combine.outs = static_cast<const float*>(received);
  combine.lses = static_cast<const float*>(lse_received);
  combine.out = combined;
  combine.lse = lse;
  combine.world_size = world;
  combine.num_tokens = static_cast<int>(tx);
  combine.num_heads = hl;
  combine.dim = dim;
  DCP_RETURN_IF_ERROR(device_.DcpCombine(combine));
  if (stats) stats->combine_bytes += int64_t(part_count + lse_count) * world * 4;
  return absl::OkStatus();
}

}  // namespace dcp
