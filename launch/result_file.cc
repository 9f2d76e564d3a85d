#include "launch/result_file.h"

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "launch/safetensors.h"
#include "core/status.h"

namespace dcp::launch {

absl::Status CheckOutputWritable(const std::string& path) {
  DCP_CHECK_ARG(!path.empty(), "--output is empty");
  struct stat info;
  if (::stat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) {
    return DCP_ERROR(InvalidArgument, "--output '%s' is a directory", path);
  }
  const size_t slash = path.rfind('/');
  const std::string folder =
      slash == std::string::npos ? "." : path.substr(0, std::max<size_t>(slash, 1));
  if (::stat(folder.c_str(), &info) != 0 || !S_ISDIR(info.st_mode)) {
    return DCP_ERROR(InvalidArgument, "--output '%s': folder '%s' does not exist", path, folder);
  }
  if (::access(folder.c_str(), W_OK) != 0) {
    return DCP_ERROR(InvalidArgument, "--output '%s': folder '%s' is not writable: %s", path,
                     folder, std::strerror(errno));
  }
  return absl::OkStatus();
}

absl::Status WriteResultFile(const std::string& path, int64_t num_tokens, int num_heads,
                             int v_head_dim, const std::vector<float>& out,
                             const std::vector<float>& lse, const ResultMetadata& metadata) {
  DCP_CHECK_ARG(int64_t(out.size()) == num_tokens * num_heads * v_head_dim &&
                    int64_t(lse.size()) == num_tokens * num_heads,
                "result of %d out and %d lse values does not match T %d, H %d, Dv %d", out.size(),
                lse.size(), num_tokens, num_heads, v_head_dim);
  SafetensorsFile file;
  file.tensors["out"] = MakeTensor<float>({num_tokens, num_heads, v_head_dim}, out);
  file.tensors["lse"] = MakeTensor<float>({num_tokens, num_heads}, lse);
  file.metadata["route"] = route_name(metadata.route);
  file.metadata["dcp_world_size"] = absl::StrCat(metadata.world_size);
  file.metadata["interleave"] = absl::StrCat(metadata.interleave);
  file.metadata["chunks"] = absl::StrCat(metadata.chunks);
  return WriteSafetensors(path, file);
}

}  // namespace dcp::launch
