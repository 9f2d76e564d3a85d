#include "core/status.h"

#include <atomic>

namespace dcp {
namespace {
std::atomic<int> g_rank{-1};
}  // namespace

int current_rank() { return g_rank.load(std::memory_order_relaxed); }
void set_current_rank(int rank) { g_rank.store(rank, std::memory_order_relaxed); }

absl::Status MakeStatus(absl::StatusCode code, std::string_view message, const char* file,
                        int line) {
  std::string_view path(file);
  // Keep the path from the project root ("core/status.cc"), not the build machine's.
  for (std::string_view root : {"/core/", "/runtime/", "/collectives/", "/attention/", "/workspace/",
                                "/launch/", "/tests/"}) {
    if (auto pos = path.rfind(root); pos != std::string_view::npos) {
      path = path.substr(pos + 1);
      break;
    }
  }
  return absl::Status(code, absl::StrFormat("[rank %d] %s:%d: %s", current_rank(), path, line,
                                            message));
}

}  // namespace dcp
