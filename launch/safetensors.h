// Reader and writer of the safetensors format: an 8-byte little-endian header length N, N bytes
// of JSON header ({name: {dtype, shape, data_offsets: [begin, end)}, "__metadata__": {str: str}}),
// then the raw little-endian data, every byte of it owned by exactly one tensor. Only the dtypes
// of this module are supported (F32, BF16, I32). Every defect of a file is an InvalidArgument
// (or NotFound) Status naming the file and the tensor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "core/dtype.h"

namespace dcp::launch {

struct Tensor {
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;  // num_elements * dtype_size bytes, little-endian

  int64_t num_elements() const;
  std::string shape_string() const;  // "[2, 3]"
  template <typename T>
  const T* as() const {
    return reinterpret_cast<const T*>(data.data());
  }
  template <typename T>
  T* as() {
    return reinterpret_cast<T*>(data.data());
  }
};

// Builds a tensor of `shape` holding a copy of `values` (size must match the shape).
template <typename T>
Tensor MakeTensor(std::vector<int64_t> shape, const std::vector<T>& values);

struct SafetensorsFile {
  std::map<std::string, Tensor> tensors;
  std::map<std::string, std::string> metadata;  // "__metadata__"
};

// Reads and validates a whole file. NotFound when it cannot be opened.
absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path);
// Parses a file image held in memory; `name` is used in messages.
absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes, std::string_view name);

// The file image: tensors in name order, header padded with spaces to a multiple of 8 bytes.
absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file);
// The temporary file WriteSafetensors writes beside `path` before renaming it over `path`.
std::string TemporaryPathFor(const std::string& path);

// Writes `path` atomically: a temporary file beside it, renamed over `path` only when every
// byte was written; on error nothing is left at `path` (an older file there stays untouched).
absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file);

// ---- implementation of the template ----
template <typename T>
Tensor MakeTensor(std::vector<int64_t> shape, const std::vector<T>& values) {
  Tensor tensor;
  tensor.dtype = dtype_of<T>();
  tensor.shape = std::move(shape);
  tensor.data.resize(values.size() * sizeof(T));
  if (!values.empty()) std::memcpy(tensor.data.data(), values.data(), tensor.data.size());
  return tensor;
}

}  // namespace dcp::launch
