#include "workspace/workspace_size.h"

#include <algorithm>
#include <numeric>

#include "core/status.h"

namespace dcp {

absl::StatusOr<WorkspaceSize> ComputeWorkspaceSize(const WorkspaceSizeInputs& in) {
  DCP_CHECK_ARG(in.block_size > 0 && in.max_num_seqs > 0 && in.max_model_len > 0 &&
                    in.index_topk > 0 && in.world_size > 0 && in.interleave > 0 &&
                    in.row_width > 0,
                "workspace size inputs must be positive (B %d, N %d, M %d, K %d, W %d, I %d, "
                "width %d)",
                in.block_size, in.max_num_seqs, in.max_model_len, in.index_topk, in.world_size,
                in.interleave, in.row_width);
  const int64_t b = in.block_size, n = in.max_num_seqs, m = in.max_model_len;
  int64_t s = std::max({8 * m, 4 * n * b});
  s = std::min({s, kWorkspaceRowCap, n * in.index_topk});
  s = std::max(s, n * b);
  DCP_CHECK_ARG(in.override_rows >= 0, "workspace rows override must be >= 0, got %d",
                in.override_rows);
  if (in.override_rows > 0) s = in.override_rows;
  const int64_t alignment = std::lcm(b, in.world_size * in.interleave);
  s = (s + alignment - 1) / alignment * alignment;

  WorkspaceSize size;
  size.rows_per_chunk = s;
  size.local_rows = s / in.world_size;
  size.total_rows = in.world_size > 1 ? s + s / in.world_size : s;
  size.row_width = in.row_width;
  return size;
}

}  // namespace dcp
