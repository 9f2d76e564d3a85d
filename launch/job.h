// dcp_run's whole life on one rank: MPI start-up, configuration (file + flags), the workload
// (synthetic batches or a problem file), the group's DcpContext, every batch with its timing,
// the optional single-rank check and result file, the summary, and MPI shut-down.
//
// Failure model: every step that can fail on some ranks only is followed by AgreeOnStatus, so
// all ranks leave with the same error, rank 0 prints it once, and every rank returns the same
// exit code. A communicator that cannot even agree (a peer died) aborts the job.
#pragma once

namespace dcp::launch {

// Exit codes of dcp_run, the same on every rank.
inline constexpr int kExitOk = 0;
inline constexpr int kExitCheckFailed = 1;   // --check past tolerance
inline constexpr int kExitBadInput = 2;      // flags, config, batch spec, problem file, np
inline constexpr int kExitRuntimeError = 3;  // anything else (device, communication, ...)

int RunJob(int argc, char** argv);

}  // namespace dcp::launch
