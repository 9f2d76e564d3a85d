#include "launch/bench/kernels_sweep.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "launch/bench/bench_check.h"
#include "launch/bench/bench_data.h"
#include "core/kv_cache_format.h"
#include "core/kv_layout.h"
#include "core/status.h"
#include "launch/bench/fp8_kernels.h"

namespace dcp::bench {
namespace {

using Measure = std::function<absl::Status(const KernelCase&)>;

constexpr uint64_t kStreamSource = 21;
constexpr double kRtol = 1e-5, kAtol = 1e-6;

KernelCase NewCase(std::string kernel, int64_t size_bytes, double bytes) {
  KernelCase c;
  c.kernel = std::move(kernel);
  c.size_bytes = size_bytes;
  c.bytes = bytes;
  return c;
}

// A permutation of [0, n): i -> (i * stride + 1) mod n, stride prime to n.
std::vector<int32_t> Permutation(int64_t n) {
  const int64_t stride = n % 7919 == 0 ? 7927 : 7919;
  std::vector<int32_t> index(n);
  for (int64_t i = 0; i < n; ++i) index[i] = static_cast<int32_t>((i * stride + 1) % n);
  return index;
}

absl::StatusOr<std::vector<std::byte>> DownloadBytes(Device& device, const void* data,
                                                     size_t bytes) {
  DCP_RETURN_IF_ERROR(device.Synchronize());
  std::vector<std::byte> host(bytes);
  if (bytes > 0) DCP_RETURN_IF_ERROR(device.CopyToHost(host.data(), data, bytes));
  return host;
}

// Elements of `element` bytes that differ between rows a and b of `width` elements.
int64_t RowMismatches(const std::byte* a, const std::byte* b, int width, size_t element) {
  if (std::memcmp(a, b, width * element) == 0) return 0;
  int64_t wrong = 0;
  for (int c = 0; c < width; ++c) {
    wrong += std::memcmp(a + c * element, b + c * element, element) != 0;
  }
  return wrong;
}

absl::Status SweepCopy(BenchEnv& env, int64_t size, const Measure& measure) {
  Device& device = *env.device;
  const size_t count = std::max<int64_t>(1, size / 4);
  Buffer src, dst;
  KernelCase c = NewCase("copy", int64_t(count * 4), 2.0 * count * 4);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(src, device.Allocate(count * 4));
    DCP_ASSIGN_OR_RETURN(dst, device.Allocate(count * 4));
    return FillRandom(device, src.data(), DType::kF32, count, env.options.seed, kStreamSource);
  }();
  c.run = [&] { return device.Copy(dst.data(), src.data(), count * 4); };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto a, DownloadBytes(device, src.data(), count * 4));
    DCP_ASSIGN_OR_RETURN(auto b, DownloadBytes(device, dst.data(), count * 4));
    return RowMismatches(a.data(), b.data(), static_cast<int>(count), 4);
  };
  return measure(c);
}

// GatherRows (dst[i] = src[perm[i]]) or ScatterRows (dst[perm[i]] = src[i]) of cache rows.
absl::Status SweepRows(BenchEnv& env, int64_t size, bool gather, const Measure& measure) {
  Device& device = *env.device;
  const DType dtype = device.storage_dtype();
  const size_t element = dtype_size(dtype);
  const int width = env.dims.latent_width();
  const size_t row_bytes = width * element;
  const int64_t rows = std::max<int64_t>(1, size / int64_t(row_bytes));
  const std::vector<int32_t> perm = Permutation(rows);
  Buffer src, dst, index;
  KernelCase c = NewCase(gather ? "gather_rows" : "scatter_rows", int64_t(rows * row_bytes),
                         2.0 * rows * row_bytes + rows * 4.0);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(src, device.Allocate(rows * row_bytes));
    DCP_ASSIGN_OR_RETURN(dst, device.Allocate(rows * row_bytes));
    DCP_ASSIGN_OR_RETURN(index, UploadInts(device, perm));
    return FillRandom(device, src.data(), dtype, size_t(rows) * width, env.options.seed,
                      kStreamSource);
  }();
  if (gather) {
    c.run = [&] {
      return device.GatherRows(
          {src.data(), index.as<int32_t>(), dst.data(), dtype, rows, rows, width, width, width});
    };
  } else {
    c.run = [&] {
      return device.ScatterRows(
          {src.data(), index.as<int32_t>(), dst.data(), dtype, rows, rows, width, width, width});
    };
  }
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto s, DownloadBytes(device, src.data(), rows * row_bytes));
    DCP_ASSIGN_OR_RETURN(auto d, DownloadBytes(device, dst.data(), rows * row_bytes));
    int64_t wrong = 0;
    for (int64_t i = 0; i < rows; ++i) {
      const size_t src_row = gather ? perm[i] : i, dst_row = gather ? i : perm[i];
      wrong += RowMismatches(&d[dst_row * row_bytes], &s[src_row * row_bytes], width, element);
    }
    return wrong;
  };
  return measure(c);
}

// The workspace fill from an fp8_ds_mla cache, with the same row count as gather_rows at this
// size: gather_rows_fp8 dequantizes 656-byte rows into rows of the storage dtype (the paged
// gather feeding the up-projection); gather_rows_fp8_raw moves the 656-byte rows unchanged (the
// rows an all-gather would carry, upconverted after it). DeepSeek dims only (R 512, Dr 64).
absl::Status SweepFp8Gather(BenchEnv& env, int64_t size, const Measure& measure) {
  namespace f = fp8_ds_mla;
  if (env.dims.kv_lora_rank != f::kLatentDim || env.dims.qk_rope_head_dim != f::kRopeDim) {
    return absl::OkStatus();
  }
  Device& device = *env.device;
  const DType dtype = device.storage_dtype();
  const size_t element = dtype_size(dtype);
  const size_t out_row_bytes = f::kRowWidth * element;
  const int64_t rows = std::max<int64_t>(1, size / int64_t(out_row_bytes));
  const std::vector<int32_t> perm = Permutation(rows);
  Buffer values, identity, cache, index, dst, raw;
  const absl::Status prepared = [&]() -> absl::Status {
    // Rows quantized from random values by the write kernel.
    DCP_ASSIGN_OR_RETURN(values, device.Allocate(rows * out_row_bytes));
    DCP_RETURN_IF_ERROR(FillRandom(device, values.data(), dtype, size_t(rows) * f::kRowWidth,
                                   env.options.seed, kStreamSource));
    std::vector<int32_t> slots(rows);
    for (int64_t i = 0; i < rows; ++i) slots[i] = static_cast<int32_t>(i);
    DCP_ASSIGN_OR_RETURN(identity, UploadInts(device, slots));
    DCP_ASSIGN_OR_RETURN(cache, device.Allocate(size_t(rows) * f::kRowBytes));
    DCP_ASSIGN_OR_RETURN(index, UploadInts(device, perm));
    DCP_ASSIGN_OR_RETURN(dst, device.Allocate(rows * out_row_bytes));
    DCP_ASSIGN_OR_RETURN(raw, device.Allocate(size_t(rows) * f::kRowBytes));
    Fp8DsMlaWriteParams w;
    w.kv_c = values.data();
    w.k_pe = static_cast<const std::byte*>(values.data()) + f::kLatentDim * element;
    w.slot_mapping = identity.as<int32_t>(), w.cache = cache.as<uint8_t>();
    w.dtype = dtype;
    w.num_rows = w.num_slots = rows;
    w.kv_c_row_stride = w.k_pe_row_stride = f::kRowWidth;
    DCP_RETURN_IF_ERROR(WriteFp8DsMlaRowsOn(device, w));
    return device.Synchronize();
  }();
  {
    KernelCase c = NewCase("gather_rows_fp8", int64_t(rows * out_row_bytes),
                           double(rows) * (f::kRowBytes + out_row_bytes) + rows * 4.0);
    c.prepared = prepared;
    Fp8DsMlaGatherParams g;
    g.cache = cache.as<uint8_t>(), g.index = index.as<int32_t>(), g.dst = dst.data();
    g.dst_dtype = dtype;
    g.num_rows = g.num_src_rows = rows;
    g.dst_row_stride = f::kRowWidth;
    c.run = [&] { return GatherFp8DsMlaRowsOn(device, g); };
    c.check = [&]() -> absl::StatusOr<int64_t> {
      DCP_ASSIGN_OR_RETURN(auto bytes, DownloadBytes(device, cache.data(), rows * f::kRowBytes));
      DCP_ASSIGN_OR_RETURN(auto got, DownloadBytes(device, dst.data(), rows * out_row_bytes));
      std::vector<float> row(f::kRowWidth);
      std::vector<std::byte> want(out_row_bytes);
      int64_t wrong = 0;
      for (int64_t i = 0; i < rows; ++i) {
        f::DequantizeRow(reinterpret_cast<const uint8_t*>(&bytes[perm[i] * f::kRowBytes]),
                         row.data());
        for (int c = 0; c < f::kRowWidth; ++c) {
          if (dtype == DType::kF32) {
            std::memcpy(&want[c * element], &row[c], 4);
          } else {
            const bf16 value = float_to_bf16(row[c]);
            std::memcpy(&want[c * element], &value, 2);
          }
        }
        wrong += RowMismatches(&got[i * out_row_bytes], want.data(), f::kRowWidth, element);
      }
      return wrong;
    };
    DCP_RETURN_IF_ERROR(measure(c));
  }
  KernelCase c = NewCase("gather_rows_fp8_raw", int64_t(rows * f::kRowBytes),
                         2.0 * rows * f::kRowBytes + rows * 4.0);
  c.prepared = prepared;
  // 656-byte rows as 328 two-byte elements.
  const int units = f::kRowBytes / 2;
  c.run = [&] {
    return device.GatherRows({cache.data(), index.as<int32_t>(), raw.data(), DType::kBF16, rows,
                              rows, units, units, units});
  };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto s, DownloadBytes(device, cache.data(), rows * f::kRowBytes));
    DCP_ASSIGN_OR_RETURN(auto d, DownloadBytes(device, raw.data(), rows * f::kRowBytes));
    int64_t wrong = 0;
    for (int64_t i = 0; i < rows; ++i) {
      wrong += RowMismatches(&d[i * f::kRowBytes], &s[perm[i] * f::kRowBytes], units, 2);
    }
    return wrong;
  };
  return measure(c);
}

// Partials of `world` ranks for rows [0, n) of width dim: outs [world, n, dim], lses [world, n].
void MakePartials(uint64_t seed, int world, int64_t n, int dim, std::vector<float>* outs,
                  std::vector<float>* lses) {
  outs->resize(size_t(world) * n * dim);
  lses->resize(size_t(world) * n);
  for (int q = 0; q < world; ++q) {
    const ValueStream value = PartialOutValues(seed, q, 0);
    for (size_t x = 0; x < size_t(n) * dim; ++x) (*outs)[q * size_t(n) * dim + x] = value(x);
    for (int64_t row = 0; row < n; ++row)
      (*lses)[q * size_t(n) + row] = PartialLse(seed, q, 0, row);
  }
}

// Compares merged rows with the double-precision merge of the partials' rows.
int64_t CheckMerged(const std::vector<float>& outs, const std::vector<float>& lses, int world,
                    int64_t n, int dim, const std::vector<float>& out,
                    const std::vector<float>& lse) {
  int64_t wrong = 0;
  std::vector<double> row_lses(world), row_outs(size_t(world) * dim), want(dim);
  for (int64_t row = 0; row < n; ++row) {
    for (int q = 0; q < world; ++q) {
      row_lses[q] = lses[q * size_t(n) + row];
      for (int d = 0; d < dim; ++d) row_outs[q * dim + d] = outs[(q * size_t(n) + row) * dim + d];
    }
    double want_lse = 0;
    MergeReference(row_lses, row_outs, dim, &want_lse, want.data());
    wrong += !Close(lse[row], want_lse, kRtol, 1e-5);
    for (int d = 0; d < dim; ++d) wrong += !Close(out[row * dim + d], want[d], kRtol, kAtol);
  }
  return wrong;
}

absl::Status SweepMergeStates(BenchEnv& env, int64_t size, const Measure& measure) {
  Device& device = *env.device;
  const int heads = env.options.heads.front(), dim = env.dims.v_head_dim;
  const int64_t tokens = std::max<int64_t>(1, size / (int64_t{heads} * dim * 4));
  const int64_t n = tokens * heads;
  std::vector<float> outs, lses;
  MakePartials(env.options.seed, 2, n, dim, &outs, &lses);
  Buffer d_outs, d_lses, out, lse;
  KernelCase c = NewCase("merge_states", n * dim * 4, (3.0 * n * dim + 3.0 * n) * 4);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(d_outs, UploadAs(device, outs, DType::kF32));
    DCP_ASSIGN_OR_RETURN(d_lses, UploadAs(device, lses, DType::kF32));
    DCP_ASSIGN_OR_RETURN(out, device.Allocate(n * dim * 4));
    DCP_ASSIGN_OR_RETURN(lse, device.Allocate(n * 4));
    return absl::OkStatus();
  }();
  MergeStatesParams p;
  p.out_a = d_outs.as<float>(), p.out_b = d_outs.as<float>() + n * dim;
  p.lse_a = d_lses.as<float>(), p.lse_b = d_lses.as<float>() + n;
  p.out = out.as<float>(), p.lse = lse.as<float>();
  p.num_tokens = static_cast<int>(tokens), p.num_heads = heads, p.dim = dim;
  c.run = [&] { return device.MergeStates(p); };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto got_out, DownloadFloats(device, out.data(), DType::kF32, n * dim));
    DCP_ASSIGN_OR_RETURN(auto got_lse, DownloadFloats(device, lse.data(), DType::kF32, n));
    return CheckMerged(outs, lses, 2, n, dim, got_out, got_lse);
  };
  return measure(c);
}

absl::Status SweepDcpCorrect(BenchEnv& env, int64_t size, const Measure& measure) {
  Device& device = *env.device;
  const int world = env.options.kernel_world, rank = env.rank % world;
  const int heads = env.options.heads.front(), dim = env.dims.kv_lora_rank;
  const int64_t tokens = std::max<int64_t>(1, size / (int64_t{heads} * dim * 4));
  const int64_t n = tokens * heads;
  std::vector<float> outs, lses;
  MakePartials(env.options.seed, world, n, dim, &outs, &lses);
  const std::vector<float> own(outs.begin() + size_t(rank) * n * dim,
                               outs.begin() + size_t(rank + 1) * n * dim);
  Buffer pristine, out, lse_all, lse_total;
  KernelCase c = NewCase("dcp_correct", n * dim * 4, (2.0 * n * dim + (world + 1.0) * n) * 4);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(pristine, UploadAs(device, own, DType::kF32));
    DCP_ASSIGN_OR_RETURN(out, device.Allocate(n * dim * 4));
    DCP_ASSIGN_OR_RETURN(lse_all, UploadAs(device, lses, DType::kF32));
    DCP_ASSIGN_OR_RETURN(lse_total, device.Allocate(n * 4));
    return absl::OkStatus();
  }();
  DcpCorrectParams p;
  p.out = out.as<float>(), p.lse_all = lse_all.as<float>(), p.lse_total = lse_total.as<float>();
  p.world_size = world, p.rank = rank;
  p.num_tokens = static_cast<int>(tokens), p.num_heads = heads, p.dim = dim;
  // The kernel scales in place: restore the partial before every run (untimed).
  c.setup = [&] { return device.Copy(out.data(), pristine.data(), n * dim * 4); };
  c.run = [&] { return device.DcpCorrect(p); };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto got_out, DownloadFloats(device, out.data(), DType::kF32, n * dim));
    DCP_ASSIGN_OR_RETURN(auto got_lse, DownloadFloats(device, lse_total.data(), DType::kF32, n));
    int64_t wrong = 0;
    std::vector<double> row_lses(world), want(1);
    const std::vector<double> no_outs(world, 0.0);
    for (int64_t row = 0; row < n; ++row) {
      for (int q = 0; q < world; ++q) row_lses[q] = lses[q * size_t(n) + row];
      double total = 0;
      MergeReference(row_lses, no_outs, 1, &total, want.data());
      wrong += !Close(got_lse[row], total, kRtol, 1e-5);
      const double own_lse = row_lses[rank];
      const double scale = std::isinf(own_lse) ? 0.0 : std::exp(own_lse - total);
      for (int d = 0; d < dim; ++d) {
        wrong += !Close(got_out[row * dim + d], scale * own[row * dim + d], kRtol, kAtol);
      }
    }
    return wrong;
  };
  return measure(c);
}

absl::Status SweepDcpCombine(BenchEnv& env, int64_t size, const Measure& measure) {
  Device& device = *env.device;
  const int world = env.options.kernel_world;
  const int heads = env.options.heads.front(), dim = env.dims.kv_lora_rank;
  const int64_t tokens = std::max<int64_t>(1, size / (int64_t{heads} * dim * 4));
  const int64_t n = tokens * heads;
  std::vector<float> outs, lses;
  MakePartials(env.options.seed, world, n, dim, &outs, &lses);
  Buffer d_outs, d_lses, out, lse;
  KernelCase c = NewCase("dcp_combine", n * dim * 4, (world + 1.0) * (n * dim + n) * 4);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(d_outs, UploadAs(device, outs, DType::kF32));
    DCP_ASSIGN_OR_RETURN(d_lses, UploadAs(device, lses, DType::kF32));
    DCP_ASSIGN_OR_RETURN(out, device.Allocate(n * dim * 4));
    DCP_ASSIGN_OR_RETURN(lse, device.Allocate(n * 4));
    return absl::OkStatus();
  }();
  DcpCombineParams p;
  p.outs = d_outs.as<float>(), p.lses = d_lses.as<float>();
  p.out = out.as<float>(), p.lse = lse.as<float>();
  p.world_size = world, p.num_tokens = static_cast<int>(tokens), p.num_heads = heads, p.dim = dim;
  c.run = [&] { return device.DcpCombine(p); };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    DCP_ASSIGN_OR_RETURN(auto got_out, DownloadFloats(device, out.data(), DType::kF32, n * dim));
    DCP_ASSIGN_OR_RETURN(auto got_lse, DownloadFloats(device, lse.data(), DType::kF32, n));
    return CheckMerged(outs, lses, world, n, dim, got_out, got_lse);
  };
  return measure(c);
}

// One request whose tokens sit at positions K-1, K, ...: every top-k row is full.
absl::Status SweepTopkToSlots(BenchEnv& env, int64_t size, const Measure& measure) {
  Device& device = *env.device;
  const BenchOptions& o = env.options;
  const int topk = o.index_topk, world = o.kernel_world, rank = env.rank % world;
  const int block = o.block_size;
  const KvLayout layout{world, o.interleave};
  const int64_t tokens = std::max<int64_t>(1, size / (int64_t{topk} * 4));
  const int64_t length = topk + tokens - 1;  // positions [0, length)
  const int max_blocks = static_cast<int>((layout.local_length(length, 0) + block - 1) / block);
  std::vector<int32_t> rows(size_t(tokens) * topk), request(tokens, 0), position(tokens);
  std::vector<int32_t> table(max_blocks);
  for (int b = 0; b < max_blocks; ++b) table[b] = max_blocks - 1 - b;  // not the identity
  for (int64_t t = 0; t < tokens; ++t) {
    position[t] = static_cast<int32_t>(topk - 1 + t);
    FillTopkRow(position[t], topk, &rows[size_t(t) * topk]);
  }
  Buffer d_rows, d_request, d_position, d_table, slots;
  KernelCase c =
      NewCase("topk_to_slots", tokens * topk * 4, 2.0 * tokens * topk * 4 + tokens * 8.0);
  c.prepared = [&]() -> absl::Status {
    DCP_ASSIGN_OR_RETURN(d_rows, UploadInts(device, rows));
    DCP_ASSIGN_OR_RETURN(d_request, UploadInts(device, request));
    DCP_ASSIGN_OR_RETURN(d_position, UploadInts(device, position));
    DCP_ASSIGN_OR_RETURN(d_table, UploadInts(device, table));
    DCP_ASSIGN_OR_RETURN(slots, device.Allocate(size_t(tokens) * topk * 4));
    return absl::OkStatus();
  }();
  TopkToSlotsParams p;
  p.topk = d_rows.as<int32_t>(), p.token_request = d_request.as<int32_t>();
  p.token_position = d_position.as<int32_t>(), p.block_tables = d_table.as<int32_t>();
  p.slots = slots.as<int32_t>();
  p.num_tokens = static_cast<int>(tokens), p.topk_width = topk, p.num_requests = 1;
  p.max_blocks = max_blocks, p.world_size = world, p.interleave = o.interleave, p.rank = rank;
  p.block_size = block;
  c.run = [&] { return device.TopkToSlots(p); };
  c.check = [&]() -> absl::StatusOr<int64_t> {
    std::vector<int32_t> got(rows.size());
    DCP_RETURN_IF_ERROR(device.Synchronize());
    DCP_RETURN_IF_ERROR(device.CopyToHost(got.data(), slots.data(), got.size() * 4));
    int64_t wrong = 0;
    for (size_t i = 0; i < rows.size(); ++i) {
      const int32_t g = rows[i];
      int64_t want = -1;
      if (g >= 0 && layout.owner(g) == rank) {
        const int64_t local = layout.local_index(g);
        want = int64_t{table[local / block]} * block + local % block;
      }
      wrong += got[i] != want;
    }
    return wrong;
  };
  return measure(c);
}

}  // namespace

absl::Status ForEachSweepKernel(BenchEnv& env, int64_t size, const Measure& measure) {
  DCP_RETURN_IF_ERROR(SweepCopy(env, size, measure));
  DCP_RETURN_IF_ERROR(SweepRows(env, size, /*gather=*/true, measure));
  DCP_RETURN_IF_ERROR(SweepFp8Gather(env, size, measure));
  DCP_RETURN_IF_ERROR(SweepRows(env, size, /*gather=*/false, measure));
  DCP_RETURN_IF_ERROR(SweepMergeStates(env, size, measure));
  DCP_RETURN_IF_ERROR(SweepDcpCorrect(env, size, measure));
  DCP_RETURN_IF_ERROR(SweepDcpCombine(env, size, measure));
  return SweepTopkToSlots(env, size, measure);
}

}  // namespace dcp::bench
