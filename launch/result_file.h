// The result file of `dcp_run --output` (FORMATS.md): out [T, H, Dv] F32 and lse [T, H] F32 in
// the problem's token order, and __metadata__ route, dcp_world_size, interleave and chunks.
#pragma once

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "runtime/batch.h"

namespace dcp::launch {

struct ResultMetadata {
  Route route = Route::kSparseMqa;
  int world_size = 1;
  int interleave = 1;
  int chunks = 0;
};

// Fails when `path` cannot be written the way WriteResultFile writes it, checked before any
// work so that a bad --output costs nothing: its folder is missing or not writable, the name
// or the temporary name beside it is too long (the temporary file is created and removed to
// be sure), or `path` exists and is not a regular file. A FIFO, a device or a socket is
// refused (the atomic rename would replace it with a regular file), and so is a symbolic link
// (the rename would replace the link, not write through it): give the link's target instead.
absl::Status CheckOutputWritable(const std::string& path);

// Written atomically (temporary file + rename): `path` appears only when complete.
absl::Status WriteResultFile(const std::string& path, int64_t num_tokens, int num_heads,
                             int v_head_dim, const std::vector<float>& out,
                             const std::vector<float>& lse, const ResultMetadata& metadata);

}  // namespace dcp::launch
