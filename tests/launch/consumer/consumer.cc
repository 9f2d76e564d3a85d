// An engine's view of dcp: one DcpContext per MPI rank, one attention layer for a batch of a
// decode (20 cached tokens) and a prefill (8 new tokens). Run under mpirun -np 1, 2 or 4.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "collectives/mpi_communicator.h"
#include "runtime/dcp.h"
#include "core/kv_layout.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  {
    auto comm = dcp::MpiCommunicator::Create(MPI_COMM_WORLD, /*timeout_s=*/60.0);
    if (!comm.ok()) MPI_Abort(MPI_COMM_WORLD, 2);
    auto device = dcp::MakeCpuDevice();
    const int world = (*comm)->world_size(), rank = (*comm)->rank();

    dcp::DcpOptions options;  // the scaled-down default dims: H 16, R 64, Dn 32, Dr 16, Dv 32
    options.dcp.world_size = world;
    options.dcp.rank = rank;
    options.attention.index_topk = 64;
    const dcp::ModelDims& m = options.model;
    const int heads = m.num_heads / world, width = m.latent_width();

    std::vector<float> w_uk(heads * m.qk_nope_head_dim * m.kv_lora_rank, 0.01f);
    std::vector<float> w_uv(heads * m.kv_lora_rank * m.v_head_dim, 0.02f);
    dcp::LayerWeights weights{
        {w_uk.data(), dcp::DType::kF32, {heads, m.qk_nope_head_dim, m.kv_lora_rank}},
        {w_uv.data(), dcp::DType::kF32, {heads, m.kv_lora_rank, m.v_head_dim}}};
    auto context = dcp::DcpContext::Create(options, **comm, *device, weights);
    if (!context.ok()) {
      std::fprintf(stderr, "consumer: %s\n", std::string(context.status().message()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    dcp::DcpContext& ctx = **context;

    // Request 1: a decode over 20 cached tokens; request 2: a prefill of 8 tokens.
    const std::vector<dcp::BatchRequest> batch = {{1, 21, 1}, {2, 8, 8}};
    const dcp::KvLayout layout{world, options.dcp.interleave};
    const int64_t local_rows = layout.local_length(20, rank);
    std::vector<float> cached(local_rows * width, 0.5f);
    bool ok = ctx.AddRequest(1).ok() && ctx.AddRequest(2).ok() &&
              ctx.LoadCachedKv(1, 20, {cached.data(), dcp::DType::kF32, {local_rows, width}}).ok();

    const int64_t tokens = 9;
    std::vector<float> q_nope(tokens * heads * m.qk_nope_head_dim, 0.1f);
    std::vector<float> q_rope(tokens * heads * m.qk_rope_head_dim, 0.1f);
    std::vector<float> kv_new(tokens * width, 0.25f);
    std::vector<float> out(tokens * heads * m.v_head_dim), lse(tokens * heads);
    dcp::BatchInputs inputs{{q_nope.data(), dcp::DType::kF32, {tokens, heads, m.qk_nope_head_dim}},
                            {q_rope.data(), dcp::DType::kF32, {tokens, heads, m.qk_rope_head_dim}},
                            {kv_new.data(), dcp::DType::kF32, {tokens, width}},
                            {}};  // no top-k: every causal key (seq_len <= index_topk)
    dcp::BatchOutputs outputs{{out.data(), dcp::DType::kF32, {tokens, heads, m.v_head_dim}},
                              {lse.data(), dcp::DType::kF32, {tokens, heads}}};
    absl::Status status = ctx.Forward(batch, inputs, outputs);
    if (!status.ok()) std::fprintf(stderr, "consumer: %s\n", std::string(status.message()).c_str());
    ok = ok && status.ok();
    // The decode attends over 21 keys of equal score: lse = log(21) + score.
    for (float v : lse) ok = ok && std::isfinite(v);
    for (float v : out) ok = ok && std::isfinite(v);
    failed = ok ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("consumer: %s on %d ranks, route %s\n", failed ? "FAILED" : "ok", world,
                  dcp::route_name(ctx.last_stats().route));
    }
  }
  MPI_Finalize();
  return failed;
}
