#include "launch/safetensors.h"

#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <limits>
#include <set>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/status.h"
#include "launch/input_file.h"
#include "nlohmann/json.hpp"

namespace dcp::launch {
namespace {

static_assert(std::endian::native == std::endian::little,
              "safetensors data is little-endian; this reader copies it as is");

// A header larger than this is a corrupt length field, not a real file (the reference
// implementation uses the same bound).
constexpr uint64_t kMaxHeaderBytes = 100u << 20;

absl::StatusOr<DType> ParseDType(const std::string& text, std::string_view file,
                                 const std::string& tensor) {
  if (text == "F32") return DType::kF32;
  if (text == "BF16") return DType::kBF16;
  if (text == "I32") return DType::kI32;
  return DCP_ERROR(InvalidArgument,
                   "%s: tensor '%s' has dtype '%s'; supported dtypes are F32, BF16 and I32", file,
                   tensor, text);
}

struct Entry {
  std::string name;
  uint64_t begin = 0, end = 0;
};

}  // namespace

int64_t Tensor::num_elements() const {
  int64_t count = 1;
  for (int64_t d : shape) count *= d;
  return count;
}

std::string Tensor::shape_string() const {
  return absl::StrCat("[", absl::StrJoin(shape, ", "), "]");
}

absl::StatusOr<SafetensorsFile> ParseSafetensors(std::string_view bytes, std::string_view name) {
  if (bytes.size() < 8) {
    return DCP_ERROR(InvalidArgument,
                     "%s: not a safetensors file: %d bytes, shorter than the 8-byte header length",
                     name, bytes.size());
  }
  uint64_t header_length = 0;
  std::memcpy(&header_length, bytes.data(), 8);
  if (header_length > kMaxHeaderBytes || header_length > bytes.size() - 8) {
    return DCP_ERROR(InvalidArgument,
                     "%s: bad safetensors header: header length %d exceeds the file (%d bytes) "
                     "or the %d-byte limit (truncated or not a safetensors file)",
                     name, header_length, bytes.size(), kMaxHeaderBytes);
  }
  const std::string_view header_text = bytes.substr(8, header_length);
  const std::string_view data = bytes.substr(8 + header_length);
  // The JSON parser stops at a NUL byte and would take what follows for the end of input; the
  // format pads the header with spaces only.
  if (const size_t nul = header_text.find('\0'); nul != std::string_view::npos) {
    return DCP_ERROR(InvalidArgument,
                     "%s: bad safetensors header: a NUL byte at header offset %d (the JSON "
                     "may be followed by spaces only)",
                     name, nul);
  }
  // JSON keeps the last of two equal keys; a header naming a tensor (or a metadata key) twice
  // is ambiguous, so the parser's callback records the first repeated key of any object.
  std::vector<std::set<std::string>> open_objects;
  std::string duplicate;
  const nlohmann::json::parser_callback_t watch_keys =
      [&](int /*depth*/, nlohmann::json::parse_event_t event, nlohmann::json& parsed) {
        using Event = nlohmann::json::parse_event_t;
        if (event == Event::object_start) {
          open_objects.emplace_back();
        } else if (event == Event::object_end && !open_objects.empty()) {
          open_objects.pop_back();
        } else if (event == Event::key && !open_objects.empty() && duplicate.empty() &&
                   !open_objects.back().insert(parsed.get<std::string>()).second) {
          duplicate = parsed.get<std::string>();
        }
        return true;
      };
  nlohmann::json header =
      nlohmann::json::parse(header_text, watch_keys, /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object()) {
    return DCP_ERROR(InvalidArgument, "%s: bad safetensors header: not a JSON object", name);
  }
  if (!duplicate.empty()) {
    return DCP_ERROR(InvalidArgument, "%s: bad safetensors header: key '%s' appears twice",
                     name, duplicate);
  }

  SafetensorsFile file;
  std::vector<Entry> entries;
  for (auto it = header.begin(); it != header.end(); ++it) {
    const std::string& key = it.key();
    const nlohmann::json& value = it.value();
    if (key == "__metadata__") {
      if (!value.is_object()) {
        return DCP_ERROR(InvalidArgument,
                         "%s: bad safetensors header: __metadata__ must be an "
                         "object of strings",
                         name);
      }
      for (auto m = value.begin(); m != value.end(); ++m) {
        if (!m.value().is_string()) {
          return DCP_ERROR(InvalidArgument,
                           "%s: bad safetensors header: __metadata__ value of '%s' must be a "
                           "string",
                           name, m.key());
        }
        file.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    if (!value.is_object() || !value.contains("dtype") || !value.contains("shape") ||
        !value.contains("data_offsets")) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: tensor '%s' needs dtype, shape and "
                       "data_offsets",
                       name, key);
    }
    const nlohmann::json& dtype = value["dtype"];
    const nlohmann::json& shape = value["shape"];
    const nlohmann::json& offsets = value["data_offsets"];
    if (!dtype.is_string()) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: dtype of '%s' must be a "
                       "string",
                       name, key);
    }
    Tensor tensor;
    DCP_ASSIGN_OR_RETURN(tensor.dtype, ParseDType(dtype.get<std::string>(), name, key));
    if (!shape.is_array()) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: shape of '%s' must be an "
                       "array",
                       name, key);
    }
    uint64_t num_elements = 1;
    for (const nlohmann::json& dim : shape) {
      if (!dim.is_number_unsigned()) {
        return DCP_ERROR(InvalidArgument,
                         "%s: bad safetensors header: shape of '%s' must hold "
                         "non-negative integers, got %s",
                         name, key, shape.dump());
      }
      const uint64_t d = dim.get<uint64_t>();
      if (d != 0 && num_elements > std::numeric_limits<int64_t>::max() / 4 / d) {
        return DCP_ERROR(InvalidArgument,
                         "%s: bad safetensors header: shape of '%s' is too "
                         "large: %s",
                         name, key, shape.dump());
      }
      num_elements *= d;
      tensor.shape.push_back(static_cast<int64_t>(d));
    }
    if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
        !offsets[1].is_number_unsigned()) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: data_offsets of '%s' must "
                       "be two non-negative integers, got %s",
                       name, key, offsets.dump());
    }
    Entry entry{key, offsets[0].get<uint64_t>(), offsets[1].get<uint64_t>()};
    const uint64_t expected = num_elements * dtype_size(tensor.dtype);
    if (entry.end < entry.begin || entry.end - entry.begin != expected) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: tensor '%s' (%s %s) needs %d bytes but its "
                       "data_offsets [%d, %d) span %d",
                       name, key, dtype.get<std::string>(), tensor.shape_string(), expected,
                       entry.begin, entry.end,
                       entry.end >= entry.begin ? entry.end - entry.begin : 0);
    }
    if (entry.end > data.size()) {
      return DCP_ERROR(InvalidArgument,
                       "%s: file truncated: tensor '%s' needs bytes [%d, %d) of the data section "
                       "but only %d bytes follow the header",
                       name, key, entry.begin, entry.end, data.size());
    }
    entries.push_back(entry);
    file.tensors.emplace(key, std::move(tensor));
  }

  // Every byte of the data section belongs to exactly one tensor.
  std::sort(entries.begin(), entries.end(), [](const Entry& a, const Entry& b) {
    return std::tie(a.begin, a.end) < std::tie(b.begin, b.end);
  });
  uint64_t covered = 0;
  for (const Entry& entry : entries) {
    if (entry.begin != covered) {
      return DCP_ERROR(InvalidArgument,
                       "%s: bad safetensors header: tensor '%s' starts at byte %d of the data "
                       "section, expected %d (tensors overlap or leave a hole)",
                       name, entry.name, entry.begin, covered);
    }
    covered = entry.end;
  }
  if (covered != data.size()) {
    return DCP_ERROR(InvalidArgument,
                     "%s: bad safetensors file: the tensors cover %d bytes of the data section "
                     "but %d bytes follow the header",
                     name, covered, data.size());
  }
  for (const Entry& entry : entries) {
    Tensor& tensor = file.tensors[entry.name];
    tensor.data.resize(entry.end - entry.begin);
    if (!tensor.data.empty()) {
      std::memcpy(tensor.data.data(), data.data() + entry.begin, tensor.data.size());
    }
  }
  return file;
}

absl::StatusOr<SafetensorsFile> ReadSafetensors(const std::string& path) {
  std::string bytes;
  DCP_RETURN_IF_ERROR(ReadInputFile(path, "safetensors file", &bytes));
  return ParseSafetensors(bytes, path);
}

absl::StatusOr<std::string> SerializeSafetensors(const SafetensorsFile& file) {
  nlohmann::json header = nlohmann::json::object();
  if (!file.metadata.empty()) {
    nlohmann::json metadata = nlohmann::json::object();
    for (const auto& [key, value] : file.metadata) metadata[key] = value;
    header["__metadata__"] = metadata;
  }
  uint64_t offset = 0;
  for (const auto& [name, tensor] : file.tensors) {
    if (name == "__metadata__") {
      return DCP_ERROR(InvalidArgument, "a tensor may not be named __metadata__");
    }
    const uint64_t bytes = uint64_t(tensor.num_elements()) * dtype_size(tensor.dtype);
    if (bytes != tensor.data.size()) {
      return DCP_ERROR(InvalidArgument, "tensor '%s' %s holds %d bytes, its shape needs %d", name,
                       tensor.shape_string(), tensor.data.size(), bytes);
    }
    header[name] = {{"dtype", std::string(dtype_name(tensor.dtype))},
                    {"shape", tensor.shape},
                    {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string header_text = header.dump();
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  const uint64_t header_length = header_text.size();
  std::string image;
  image.reserve(8 + header_text.size() + offset);
  image.append(reinterpret_cast<const char*>(&header_length), 8);
  image += header_text;
  for (const auto& [name, tensor] : file.tensors) {
    image.append(reinterpret_cast<const char*>(tensor.data.data()), tensor.data.size());
  }
  return image;
}

std::string TemporaryPathFor(const std::string& path) {
  return absl::StrCat(path, ".tmp.", ::getpid());
}

absl::Status WriteSafetensors(const std::string& path, const SafetensorsFile& file) {
  DCP_ASSIGN_OR_RETURN(std::string image, SerializeSafetensors(file));
  const std::string temp = TemporaryPathFor(path);
  std::FILE* out = std::fopen(temp.c_str(), "wb");
  if (out == nullptr) {
    return DCP_ERROR(InvalidArgument, "cannot write '%s': %s", path, std::strerror(errno));
  }
  const bool written = std::fwrite(image.data(), 1, image.size(), out) == image.size();
  const int write_errno = errno;
  const bool closed = std::fclose(out) == 0;
  if (!written || !closed) {
    std::remove(temp.c_str());
    return DCP_ERROR(Internal, "cannot write '%s': %s", path, std::strerror(write_errno));
  }
  if (std::rename(temp.c_str(), path.c_str()) != 0) {
    const int rename_errno = errno;
    std::remove(temp.c_str());
    return DCP_ERROR(InvalidArgument, "cannot write '%s': %s", path, std::strerror(rename_errno));
  }
  return absl::OkStatus();
}

}  // namespace dcp::launch
