#include "launch/bench/bench_data.h"

#include <algorithm>
#include <cstddef>

#include "core/dtype.h"
#include "core/status.h"

namespace dcp::bench {

absl::StatusOr<Buffer> UploadAs(Device& device, absl::Span<const float> values, DType dtype) {
  DCP_CHECK_ARG(dtype == DType::kF32 || dtype == DType::kBF16, "UploadAs: %s is not a float",
                dtype_name(dtype));
  DCP_ASSIGN_OR_RETURN(Buffer buffer,
                       device.Allocate(std::max<size_t>(values.size() * dtype_size(dtype), 4)));
  if (values.empty()) return buffer;
  if (dtype == DType::kF32) {
    DCP_RETURN_IF_ERROR(device.CopyFromHost(buffer.data(), values.data(), values.size() * 4));
  } else {
    std::vector<bf16> converted(values.size());
    for (size_t i = 0; i < values.size(); ++i) converted[i] = float_to_bf16(values[i]);
    DCP_RETURN_IF_ERROR(device.CopyFromHost(buffer.data(), converted.data(), values.size() * 2));
  }
  return buffer;
}

absl::StatusOr<Buffer> UploadInts(Device& device, absl::Span<const int32_t> values) {
  DCP_ASSIGN_OR_RETURN(Buffer buffer, device.Allocate(std::max<size_t>(values.size() * 4, 4)));
  if (!values.empty()) {
    DCP_RETURN_IF_ERROR(device.CopyFromHost(buffer.data(), values.data(), values.size() * 4));
  }
  return buffer;
}

absl::StatusOr<std::vector<float>> DownloadFloats(Device& device, const void* data, DType dtype,
                                                  size_t count) {
  DCP_RETURN_IF_ERROR(device.Synchronize());
  std::vector<float> values(count);
  if (count == 0) return values;
  if (dtype == DType::kF32) {
    DCP_RETURN_IF_ERROR(device.CopyToHost(values.data(), data, count * 4));
  } else {
    DCP_CHECK_ARG(dtype == DType::kBF16, "DownloadFloats: %s is not a float", dtype_name(dtype));
    std::vector<bf16> raw(count);
    DCP_RETURN_IF_ERROR(device.CopyToHost(raw.data(), data, count * 2));
    for (size_t i = 0; i < count; ++i) values[i] = bf16_to_float(raw[i]);
  }
  return values;
}

absl::StatusOr<Buffer> AllocateZeroed(Device& device, size_t bytes) {
  DCP_ASSIGN_OR_RETURN(Buffer buffer, device.Allocate(std::max<size_t>(bytes, 4)));
  DCP_RETURN_IF_ERROR(device.Memset(buffer.data(), 0, buffer.bytes()));
  return buffer;
}

absl::Status FillRandom(Device& device, void* data, DType dtype, size_t count, uint64_t seed,
                        uint64_t stream, float scale) {
  if (count == 0) return absl::OkStatus();
  const size_t block = std::min<size_t>(count, size_t{1} << 20);
  const size_t element = dtype_size(dtype);
  if (dtype == DType::kI32) return DCP_ERROR(InvalidArgument, "FillRandom: I32 is not a float");
  std::vector<float> values(block);
  const ValueStream value(seed, stream);
  for (size_t i = 0; i < block; ++i) values[i] = scale * value(i);
  if (dtype == DType::kF32) {
    DCP_RETURN_IF_ERROR(device.CopyFromHost(data, values.data(), block * 4));
  } else {
    std::vector<bf16> converted(block);
    for (size_t i = 0; i < block; ++i) converted[i] = float_to_bf16(values[i]);
    DCP_RETURN_IF_ERROR(device.CopyFromHost(data, converted.data(), block * 2));
  }
  // Doubling copies of what is already filled.
  auto* bytes = static_cast<std::byte*>(data);
  for (size_t filled = block; filled < count;) {
    const size_t chunk = std::min(filled, count - filled);
    DCP_RETURN_IF_ERROR(device.Copy(bytes + filled * element, bytes, chunk * element));
    filled += chunk;
  }
  return device.Synchronize();
}

double BatchShape::SelectedKeys(int topk) const {
  double keys = 0;
  for (const launch::RequestShape& r : requests) {
    const int64_t context = r.seq_len - r.query_len;
    for (int64_t i = 0; i < r.query_len; ++i) keys += std::min<int64_t>(context + i + 1, topk);
  }
  return keys;
}

absl::StatusOr<BatchShape> ParseShape(const std::string& spec) {
  BatchShape shape;
  shape.spec = spec;
  DCP_ASSIGN_OR_RETURN(shape.requests, launch::ParseBatchSpec(spec));
  DCP_CHECK_ARG(!shape.requests.empty(), "batch spec '%s' has no request", spec);
  for (const launch::RequestShape& r : shape.requests) {
    shape.num_tokens += r.query_len;
    shape.num_keys += r.seq_len;
    shape.max_seq_len = std::max(shape.max_seq_len, r.seq_len);
    shape.max_query_len = std::max(shape.max_query_len, r.query_len);
    shape.has_context = shape.has_context || r.seq_len > r.query_len;
  }
  return shape;
}

void FillTopkRow(int32_t position, int topk, int32_t* row) {
  if (position < topk) {
    for (int32_t j = 0; j <= position; ++j) row[j] = j;
    std::fill(row + position + 1, row + topk, -1);
    return;
  }
  // topk - 1 distinct earlier positions: floor(i * position / (topk - 1)) is strictly
  // increasing in i because position >= topk > topk - 1.
  for (int i = 0; i < topk - 1; ++i) {
    row[i] = static_cast<int32_t>(int64_t{i} * position / (topk - 1));
  }
  row[topk - 1] = position;
}

}  // namespace dcp::bench
