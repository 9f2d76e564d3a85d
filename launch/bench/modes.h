// The modes of dcp_bench, one file each, all bound into the harness (bench_harness.h).
// Each is collective: every rank calls it with the same options. Errors that leave the group
// unusable are returned; a measurement that fails is a row whose status says why.
#pragma once

#include "absl/status/statusor.h"
#include "launch/bench/bench_harness.h"

namespace dcp::bench {

// routes_mode.cc: whole-layer latency through the dense MHA and the sparse MQA route.
absl::StatusOr<ModeResult> RunRoutes(BenchEnv& env);
// kernels_mode.cc: each Device kernel alone against the copy and GEMM ceilings.
absl::StatusOr<ModeResult> RunKernels(BenchEnv& env);
// collectives_mode.cc: workspace fill and the two combines over a size sweep.
absl::StatusOr<ModeResult> RunCollectives(BenchEnv& env);
// engine_mode.cc: one layer through DcpEngine::Run, host time, eager and graph-replayed.
absl::StatusOr<ModeResult> RunEngine(BenchEnv& env);

}  // namespace dcp::bench
