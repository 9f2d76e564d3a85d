// An engine's view of dcp, built against the installed package: one DcpEngine per MPI rank,
// the engine's own paged KV cache (one per layer) and block tables, one step planned once and
// run through two layers. The batch: a decode over 20 cached tokens and a prefill of 8 tokens.
// Run under mpirun -np 1, 2 or 4.
#include <mpi.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include "collectives/mpi_communicator.h"
#include "core/kv_layout.h"
#include "runtime/device.h"
#include "runtime/engine.h"

int main(int argc, char** argv) {
  MPI_Init(&argc, &argv);
  int failed = 0;
  {
    auto comm = dcp::MpiCommunicator::Create(MPI_COMM_WORLD, /*timeout_s=*/60.0);
    if (!comm.ok()) MPI_Abort(MPI_COMM_WORLD, 2);
    auto device = dcp::MakeCpuDevice();  // host memory, fp32 storage
    const int world = (*comm)->world_size(), rank = (*comm)->rank();

    dcp::DcpOptions options;  // the scaled-down default dims: H 16, R 64, Dn 32, Dr 16, Dv 32
    options.dcp.world_size = world;
    options.dcp.rank = rank;
    options.attention.index_topk = 64;
    options.scheduler.block_size = 16;
    const dcp::ModelDims& m = options.model;
    const int heads = m.num_heads / world, width = m.latent_width();
    auto engine = dcp::DcpEngine::Create(options, **comm, *device);
    if (!engine.ok()) {
      std::fprintf(stderr, "consumer: %s\n", std::string(engine.status().message()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }

    // The engine's cache of each layer: 8 blocks of 16 rows on this rank. Request 1 (blocks
    // 3, 5) holds 20 cached tokens, this rank's share of them at its local rows; request 2
    // (block 0) is new.
    const int64_t num_blocks = 8;
    const dcp::KvLayout layout{world, options.dcp.interleave};
    std::vector<std::vector<float>> caches(2, std::vector<float>(num_blocks * 16 * width, 0.0f));
    const std::vector<int32_t> tables = {3, 5, 0, -1};  // [2 requests, 2 blocks]
    for (auto& cache : caches) {
      for (int64_t j = 0; j < layout.local_length(20, rank); ++j) {
        const int64_t slot = dcp::slot_of_local_row(tables.data(), 16, j);
        for (int c = 0; c < width; ++c) cache[slot * width + c] = 0.5f;
      }
    }
    const std::vector<dcp::BatchRequest> batch = {{1, 21, 1}, {2, 8, 8}};
    absl::Status status = (*engine)->Plan(batch, {tables.data(), 2, num_blocks, 16},
                                          /*topk_width=*/0);  // no top-k: every causal key

    // Each layer: its weights, its cache, the same step's plan.
    const int64_t tokens = 9;
    std::vector<float> w_uk(heads * m.qk_nope_head_dim * m.kv_lora_rank, 0.01f);
    std::vector<float> w_uv(heads * m.kv_lora_rank * m.v_head_dim, 0.02f);
    std::vector<float> q_nope(tokens * heads * m.qk_nope_head_dim, 0.1f);
    std::vector<float> q_rope(tokens * heads * m.qk_rope_head_dim, 0.1f);
    std::vector<float> kv_new(tokens * width, 0.25f);
    std::vector<std::vector<float>> out(2, std::vector<float>(tokens * heads * m.v_head_dim));
    std::vector<std::vector<float>> lse(2, std::vector<float>(tokens * heads));
    for (int layer = 0; layer < 2 && status.ok(); ++layer) {
      const dcp::KvCacheView cache{caches[layer].data(), dcp::DType::kF32, num_blocks, 16, width};
      const dcp::LayerTensors tensors{q_nope.data(), q_rope.data(), kv_new.data(), nullptr,
                                      out[layer].data(), lse[layer].data()};
      status = (*engine)->Run({w_uk.data(), w_uv.data()}, cache, tensors);
    }
    if (!status.ok()) std::fprintf(stderr, "consumer: %s\n", std::string(status.message()).c_str());
    bool ok = status.ok();
    // Both layers had the same weights, inputs and cache: the same outputs, all finite.
    for (float v : lse[0]) ok = ok && std::isfinite(v);
    for (float v : out[0]) ok = ok && std::isfinite(v);
    ok = ok && out[0] == out[1] && lse[0] == lse[1];
    failed = ok ? 0 : 1;
    MPI_Allreduce(MPI_IN_PLACE, &failed, 1, MPI_INT, MPI_MAX, MPI_COMM_WORLD);
    if (rank == 0) {
      std::printf("consumer: %s on %d ranks, 2 layers, route %s\n", failed ? "FAILED" : "ok",
                  world, dcp::route_name((*engine)->plan().route));
    }
  }
  MPI_Finalize();
  return failed;
}
