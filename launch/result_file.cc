#include "launch/result_file.h"

#include <fcntl.h>
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
  if (::lstat(path.c_str(), &info) == 0) {
    if (S_ISDIR(info.st_mode)) {
      return DCP_ERROR(InvalidArgument, "--output '%s' is a directory", path);
    }
    if (S_ISLNK(info.st_mode)) {
      return DCP_ERROR(InvalidArgument,
                       "--output '%s' is a symbolic link: the result is written to a temporary "
                       "file renamed over the path, which would replace the link; give the "
                       "link's target instead",
                       path);
    }
    if (!S_ISREG(info.st_mode)) {
      return DCP_ERROR(InvalidArgument,
                       "--output '%s' exists and is not a regular file (a FIFO, device or "
                       "socket): the result is a safetensors file written atomically",
                       path);
    }
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
  // The temporary name is longer than the path: both must fit the file system's limits.
  const std::string temp = TemporaryPathFor(path);
  const std::string temp_name = slash == std::string::npos ? temp : temp.substr(slash + 1);
  const long name_max = ::pathconf(folder.c_str(), _PC_NAME_MAX);
  if (name_max > 0 && temp_name.size() > size_t(name_max)) {
    return DCP_ERROR(InvalidArgument,
                     "--output '%s': the file name is too long: the temporary file '%s' beside "
                     "it has a %d-character name, the file system allows %d",
                     path, temp_name, temp_name.size(), name_max);
  }
  const int fd = ::open(temp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) {
    return DCP_ERROR(InvalidArgument, "--output '%s': cannot create the temporary file '%s': %s",
                     path, temp, std::strerror(errno));
  }
  ::close(fd);
  ::unlink(temp.c_str());
  return absl::OkStatus();
}

absl::Status WriteResultFile(const std::string& path, int64_t num_tokens, int num_heads,
                             int v_head_dim, const std::vector<float>& out,
                             const std::vector<float>& lse, const ResultMetadata& metadata) {
  DCP_CHECK_ARG(int64_t(out.size()) == num_tokens * num_heads * v_head_dim &&
                    int64_t(lse.size()) == num_tokens * num_heads,
                "result of %d out and %d lse values does not match T %d, H %d, Dv %d", out.size(),
                lse.size(), num_tokens, num_heads, v_head_dim);
  // Checked again: the path may have changed since the run started.
  DCP_RETURN_IF_ERROR(CheckOutputWritable(path));
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
