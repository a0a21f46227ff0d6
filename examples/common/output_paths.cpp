#include "common/output_paths.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collectives/termination.h"
#include "core/error.h"

namespace loom::cli {

std::string output_path_problem(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "is a directory";
    if (access(path.c_str(), W_OK) != 0)
      return detail::str_cat("exists but is not writable (", std::strerror(errno), ")");
    return "";
  }
  if (errno != ENOENT) return std::strerror(errno);
  const size_t slash = path.find_last_of('/');
  const std::string dir =
      slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
  if (stat(dir.c_str(), &st) != 0)
    return detail::str_cat("directory '", dir, "' does not exist (", std::strerror(errno),
                           "); create it first");
  if (!S_ISDIR(st.st_mode)) return detail::str_cat("'", dir, "' is not a directory");
  if (access(dir.c_str(), W_OK | X_OK) != 0)
    return detail::str_cat("directory '", dir, "' is not writable (", std::strerror(errno), ")");
  return "";
}

void check_output_paths(const std::string& program, comm::Communicator& world,
                        const std::vector<std::pair<std::string, std::string>>& flag_paths) {
  std::string verdict;
  if (world.rank() == 0) {
    for (const auto& [flag, path] : flag_paths) {
      if (path.empty()) continue;
      const std::string problem = output_path_problem(path);
      if (!problem.empty()) {
        verdict = detail::str_cat(program, ": --", flag, " '", path, "': ", problem,
                                  " (rank 0 writes it; checked before the first step)");
        break;
      }
    }
  }
  if (world.size() > 1) {
    // One fixed-size broadcast: the message, or a leading 0 byte when every path is fine.
    constexpr int64_t kBytes = 1024;
    Tensor buffer = Tensor::zeros({kBytes}, DType::kU8);
    if (world.rank() == 0) {
      const size_t n = std::min(verdict.size(), size_t(kBytes - 1));
      std::memcpy(buffer.data_ptr(), verdict.data(), n);
    }
    world.broadcast(buffer)->wait();
    verdict = std::string(static_cast<const char*>(buffer.data_ptr()));
  }
  if (!verdict.empty()) {
    comm::agree_on_exit();  // every rank fails here with the same message
    LOOM_FAIL(verdict);
  }
}

}  // namespace loom::cli
