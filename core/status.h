// One error model for the whole module: absl::Status / absl::StatusOr<T> end to end.
// Return codes of MPI, CUDA and NCCL become a Status at the call site (collectives/mpi_status.h,
// core/cuda/cuda_status.h, collectives/cuda/nccl_status.h), carrying the call's
// text, the rank and file:line, so the first error reads the same on every rank.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"

namespace dcp {

// The rank printed in errors and log lines of this process; -1 until the bootstrap sets it.
int current_rank();
void set_current_rank(int rank);

// "[rank r] file:line: message": the common shape of every error this module builds.
absl::Status MakeStatus(absl::StatusCode code, std::string_view message, const char* file,
                        int line);

}  // namespace dcp

#define DCP_STATUS_CONCAT_INNER_(a, b) a##b
#define DCP_STATUS_CONCAT_(a, b) DCP_STATUS_CONCAT_INNER_(a, b)

// Returns the Status of `expr` from the enclosing function when it is not OK.
#define DCP_RETURN_IF_ERROR(expr)                            \
  do {                                                       \
    ::absl::Status dcp_status_ = (expr);                     \
    if (!dcp_status_.ok()) return dcp_status_;               \
  } while (0)

// `DCP_ASSIGN_OR_RETURN(auto x, MakeX());` assigns the value or returns the error.
#define DCP_ASSIGN_OR_RETURN(lhs, rexpr) \
  DCP_ASSIGN_OR_RETURN_IMPL_(DCP_STATUS_CONCAT_(dcp_statusor_, __LINE__), lhs, rexpr)
#define DCP_ASSIGN_OR_RETURN_IMPL_(statusor, lhs, rexpr) \
  auto statusor = (rexpr);                               \
  if (!statusor.ok()) return std::move(statusor).status(); \
  lhs = std::move(statusor).value()

// Builds an error Status with rank and file:line: DCP_ERROR(InvalidArgument, "fmt", args...).
#define DCP_ERROR(code, ...)                                                          \
  ::dcp::MakeStatus(::absl::StatusCode::k##code, ::absl::StrFormat(__VA_ARGS__), __FILE__, \
                    __LINE__)

// Returns an InvalidArgument error naming the failed condition when `cond` is false.
#define DCP_CHECK_ARG(cond, ...)                                       \
  do {                                                                 \
    if (!(cond)) return DCP_ERROR(InvalidArgument, __VA_ARGS__);       \
  } while (0)
