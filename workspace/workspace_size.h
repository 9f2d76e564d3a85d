// Size of the DCP chunked-prefill workspace (DESIGN.md section 6), the seed's formula:
//   S = max(min(max(8*M, 4*N*B), 65536, N*K), N*B)
//   S = round_up(S, lcm(B, W*I))           DCP alignment: every rank gathers S/W whole rows
//   rows = S + S/W if W > 1 else S          [ local gather S/W | all-gather W x S/W ]
// B block size, N max_num_seqs, M max_model_len, K index_topk, W world size, I interleave.
#pragma once

#include <cstdint>

#include "absl/status/statusor.h"

namespace dcp {

struct WorkspaceSize {
  int64_t rows_per_chunk = 0;  // S: context rows one chunk gathers, all ranks together
  int64_t local_rows = 0;      // S/W: rows each rank gathers per chunk
  int64_t total_rows = 0;      // S + S/W (S when W == 1)
  int row_width = 0;           // R + Dr
};

struct WorkspaceSizeInputs {
  int64_t block_size = 0;     // B
  int64_t max_num_seqs = 0;   // N
  int64_t max_model_len = 0;  // M
  int64_t index_topk = 0;     // K
  int64_t world_size = 1;     // W
  int64_t interleave = 1;     // I
  int row_width = 0;          // R + Dr
  int64_t override_rows = 0;  // > 0: use this S instead of the formula (still aligned)
};

inline constexpr int64_t kWorkspaceRowCap = 65536;

absl::StatusOr<WorkspaceSize> ComputeWorkspaceSize(const WorkspaceSizeInputs& inputs);

}  // namespace dcp
