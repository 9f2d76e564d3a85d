#include "launch/summary.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "core/status.h"
#include "launch/version.h"

namespace dcp::launch {
namespace {

std::string Bytes(double bytes) {
  if (bytes >= 1e9) return absl::StrFormat("%.2f GB", bytes / 1e9);
  if (bytes >= 1e6) return absl::StrFormat("%.2f MB", bytes / 1e6);
  if (bytes >= 1e3) return absl::StrFormat("%.2f kB", bytes / 1e3);
  return absl::StrFormat("%.0f B", bytes);
}

std::string Ms(double seconds) { return absl::StrFormat("%.3f", seconds * 1e3); }

double Rate(double amount, double seconds) { return seconds > 0 ? amount / seconds : 0.0; }

nlohmann::json ReportJson(const BatchReport& r) {
  nlohmann::json json = {{"batch", r.label},
                         {"route", r.route},
                         {"requests", r.num_requests},
                         {"decodes", r.num_decodes},
                         {"prefills", r.num_prefills},
                         {"tokens", r.num_tokens},
                         {"context_rows", r.num_context_rows},
                         {"chunks", r.num_chunks},
                         {"iters", r.iters},
                         {"time_s",
                          {{"plan", r.plan_s},
                           {"cache_write", r.cache_write_s},
                           {"gather", r.gather_s},
                           {"up_projection", r.up_projection_s},
                           {"attention", r.attention_s},
                           {"combine", r.combine_s},
                           {"total", r.total_s}}},
                         {"collectives",
                          {{"all_gather_bytes_per_rank", r.all_gather_bytes},
                           {"combine_bytes_per_rank", r.combine_bytes},
                           {"all_gather_s", r.all_gather_comm_s},
                           {"combine_s", r.combine_comm_s},
                           {"all_gather_gb_per_s", r.all_gather_gbps},
                           {"combine_gb_per_s", r.combine_gbps},
                           {"gb_per_s", r.collective_gbps}}},
                         {"flops", r.flops},
                         {"gflop_per_s", r.gflops_per_s}};
  if (r.check.has_value()) {
    const CheckResult& c = *r.check;
    // JSON has no infinity: a non-finite error is written as null.
    const auto finite = [](double v) { return std::isfinite(v) ? nlohmann::json(v) : nullptr; };
    json["check"] = {{"out_max_abs", finite(c.out_max_abs)},
                     {"out_max_rel", finite(c.out_max_rel)},
                     {"lse_max_abs", finite(c.lse_max_abs)},
                     {"lse_max_rel", finite(c.lse_max_rel)},
                     {"tolerance", c.tolerance},
                     {"passed", c.passed}};
  }
  return json;
}

}  // namespace

void StatsAccumulator::Add(const ForwardStats& s) {
  sum_.plan_s += s.plan_s;
  sum_.cache_write_s += s.cache_write_s;
  sum_.gather_s += s.gather_s;
  sum_.up_projection_s += s.up_projection_s;
  sum_.attention_s += s.attention_s;
  sum_.combine_s += s.combine_s;
  sum_.all_gather_comm_s += s.all_gather_comm_s;
  sum_.combine_comm_s += s.combine_comm_s;
  sum_.total_s += s.total_s;
  sum_.all_gather_bytes += s.all_gather_bytes;
  sum_.combine_bytes += s.combine_bytes;
  sum_.flops += s.flops;
  last_ = s;
  ++count_;
}

ForwardStats StatsAccumulator::Mean() const {
  ForwardStats mean = last_;
  const double n = std::max(count_, 1);
  mean.plan_s = sum_.plan_s / n;
  mean.cache_write_s = sum_.cache_write_s / n;
  mean.gather_s = sum_.gather_s / n;
  mean.up_projection_s = sum_.up_projection_s / n;
  mean.attention_s = sum_.attention_s / n;
  mean.combine_s = sum_.combine_s / n;
  mean.all_gather_comm_s = sum_.all_gather_comm_s / n;
  mean.combine_comm_s = sum_.combine_comm_s / n;
  mean.total_s = sum_.total_s / n;
  mean.all_gather_bytes = static_cast<int64_t>(double(sum_.all_gather_bytes) / n);
  mean.combine_bytes = static_cast<int64_t>(double(sum_.combine_bytes) / n);
  mean.flops = sum_.flops / n;
  return mean;
}

absl::StatusOr<BatchReport> ReduceStats(Communicator& comm, const ForwardStats& mean, int iters) {
  const int world = comm.world_size();
  // Every value travels as the bits of a double through the control plane.
  const double mine[] = {mean.plan_s,
                         mean.cache_write_s,
                         mean.gather_s,
                         mean.up_projection_s,
                         mean.attention_s,
                         mean.combine_s,
                         mean.total_s,
                         double(mean.all_gather_bytes),
                         double(mean.combine_bytes),
                         mean.flops,
                         mean.all_gather_comm_s,
                         mean.combine_comm_s};
  constexpr int kCount = sizeof(mine) / sizeof(mine[0]);
  std::vector<std::vector<double>> all(kCount, std::vector<double>(world));
  std::vector<int64_t> bits(world);
  for (int k = 0; k < kCount; ++k) {
    DCP_RETURN_IF_ERROR(comm.HostAllGather(std::bit_cast<int64_t>(mine[k]), absl::MakeSpan(bits)));
    for (int r = 0; r < world; ++r) all[k][r] = std::bit_cast<double>(bits[r]);
  }
  const auto max_of = [&](int k) { return *std::max_element(all[k].begin(), all[k].end()); };
  const auto sum_of = [&](int k) {
    double sum = 0;
    for (double v : all[k]) sum += v;
    return sum;
  };
  BatchReport report;
  report.route = route_name(mean.route);
  report.num_decodes = mean.num_decodes;
  report.num_prefills = mean.num_prefills;
  report.num_requests = mean.num_decodes + mean.num_prefills;
  report.num_chunks = mean.num_chunks;
  report.num_tokens = mean.num_tokens;
  report.num_context_rows = mean.num_context_rows;
  report.iters = iters;
  report.plan_s = max_of(0);
  report.cache_write_s = max_of(1);
  report.gather_s = max_of(2);
  report.up_projection_s = max_of(3);
  report.attention_s = max_of(4);
  report.combine_s = max_of(5);
  report.total_s = max_of(6);
  report.all_gather_bytes = sum_of(7) / world;
  report.combine_bytes = sum_of(8) / world;
  report.all_gather_comm_s = max_of(10);
  report.combine_comm_s = max_of(11);
  report.all_gather_gbps = Rate(report.all_gather_bytes, report.all_gather_comm_s) / 1e9;
  report.combine_gbps = Rate(report.combine_bytes, report.combine_comm_s) / 1e9;
  report.collective_gbps = Rate(report.all_gather_bytes + report.combine_bytes,
                                report.all_gather_comm_s + report.combine_comm_s) /
                           1e9;
  report.flops = sum_of(9);
  report.gflops_per_s = Rate(report.flops, report.total_s) / 1e9;
  return report;
}

std::string FormatHeader(const RunDescription& run) {
  const ModelDims& m = run.model;
  return absl::StrFormat(
      "dcp_run: %d ranks, device %s, comm %s, combine %s | model H=%d R=%d Dn=%d Dr=%d Dv=%d, "
      "index_topk %d, interleave %d, block %d | %s%s\n",
      run.world_size, run.device, run.comm, run.combine, m.num_heads, m.kv_lora_rank,
      m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, run.index_topk, run.interleave,
      run.block_size, run.source,
      run.input_dtype.empty() ? "" : absl::StrCat(" (", run.input_dtype, " inputs)"));
}

std::string FormatReport(const BatchReport& r, int index, int count) {
  std::string text = absl::StrFormat(
      "batch %d/%d %s: route %s | %d requests (%d decode, %d prefill), %d tokens | dense "
      "context: %d rows in %d chunks\n",
      index + 1, count, r.label, r.route, r.num_requests, r.num_decodes, r.num_prefills,
      r.num_tokens, r.num_context_rows, r.num_chunks);
  absl::StrAppendFormat(
      &text,
      "  ms/iter (slowest rank, %d iters): total %s | plan %s, cache write %s, gather + "
      "all-gather %s, up-projection %s, attention %s, combine %s\n",
      r.iters, Ms(r.total_s), Ms(r.plan_s), Ms(r.cache_write_s), Ms(r.gather_s),
      Ms(r.up_projection_s), Ms(r.attention_s), Ms(r.combine_s));
  absl::StrAppendFormat(&text,
                        "  collectives per rank: all-gather %s in %s ms (%.2f GB/s), combine %s "
                        "in %s ms (%.2f GB/s) | group %.2f GFLOP/s\n",
                        Bytes(r.all_gather_bytes), Ms(r.all_gather_comm_s), r.all_gather_gbps,
                        Bytes(r.combine_bytes), Ms(r.combine_comm_s), r.combine_gbps,
                        r.gflops_per_s);
  if (r.check.has_value()) {
    const CheckResult& c = *r.check;
    absl::StrAppendFormat(&text,
                          "  check vs single-rank reference: out max abs %.3g rel %.3g | lse max "
                          "abs %.3g rel %.3g | tolerance %.3g: %s%s\n",
                          c.out_max_abs, c.out_max_rel, c.lse_max_abs, c.lse_max_rel, c.tolerance,
                          c.passed ? "PASS" : "FAIL",
                          c.passed ? "" : absl::StrCat(" (worst: ", c.first_failure, ")"));
  }
  return text;
}

nlohmann::json RunJson(const RunDescription& run, const std::vector<BatchReport>& reports,
                       bool passed) {
  const ModelDims& m = run.model;
  nlohmann::json batches = nlohmann::json::array();
  for (const BatchReport& r : reports) batches.push_back(ReportJson(r));
  return {{"format_version", kOutputFormatVersion},
          {"version", ProjectVersion()},
          {"commit", GitCommit()},
          {"timestamp", TimestampUtc()},
          {"world_size", run.world_size},
          {"device", run.device},
          {"comm", run.comm},
          {"combine", run.combine},
          {"source", run.source},
          {"input_dtype", run.input_dtype},
          {"model",
           {{"num_heads", m.num_heads},
            {"kv_lora_rank", m.kv_lora_rank},
            {"qk_nope_head_dim", m.qk_nope_head_dim},
            {"qk_rope_head_dim", m.qk_rope_head_dim},
            {"v_head_dim", m.v_head_dim},
            {"softmax_scale", m.scale()}}},
          {"index_topk", run.index_topk},
          {"interleave", run.interleave},
          {"block_size", run.block_size},
          {"batches", batches},
          {"passed", passed}};
}

}  // namespace dcp::launch
