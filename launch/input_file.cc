#include "launch/input_file.h"

#include <sys/stat.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <iterator>

#include "core/status.h"

namespace dcp::launch {

absl::Status ReadInputFile(const std::string& path, std::string_view what, std::string* bytes) {
  struct stat info;
  if (::stat(path.c_str(), &info) != 0) {
    const int error = errno;
    if (error == ENOENT) return DCP_ERROR(NotFound, "%s '%s' does not exist", what, path);
    return DCP_ERROR(InvalidArgument, "cannot open %s '%s': %s", what, path, std::strerror(error));
  }
  if (S_ISDIR(info.st_mode)) {
    return DCP_ERROR(InvalidArgument, "%s '%s' is a directory, not a file", what, path);
  }
  if (!S_ISREG(info.st_mode)) {
    return DCP_ERROR(InvalidArgument,
                     "%s '%s' is not a regular file (a FIFO, device or socket): give a file", what,
                     path);
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return DCP_ERROR(InvalidArgument, "cannot open %s '%s': %s", what, path, std::strerror(errno));
  }
  bytes->assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
  if (in.bad()) {
    return DCP_ERROR(InvalidArgument, "cannot read %s '%s': %s", what, path, std::strerror(errno));
  }
  return absl::OkStatus();
}

}  // namespace dcp::launch
