#include "common/output_paths.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "collectives/termination.h"
#include "core/error.h"

namespace loom::cli {

namespace {

std::string parent_of(const std::string& path) {
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? "." : (slash == 0 ? "/" : path.substr(0, slash));
}

// Whether `dir` takes a new file: creates a probe file in it and removes it ("" when it does).
std::string probe_directory(const std::string& dir) {
  char host[64] = "host";
  gethostname(host, sizeof host - 1);
  const std::string probe =
      detail::str_cat(dir, "/.loom-write-probe.", host, ".", static_cast<long>(getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
  if (fd < 0)
    return detail::str_cat("directory '", dir, "' does not take a new file (", std::strerror(errno),
                           ")");
  ::close(fd);
  ::unlink(probe.c_str());
  return "";
}

}  // namespace

std::string output_path_problem(const std::string& path) {
  struct stat st {};
  if (stat(path.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) return "is a directory";
    if (!S_ISREG(st.st_mode)) return "exists but is not a regular file";
    const int fd = ::open(path.c_str(), O_WRONLY | O_CLOEXEC);  // no O_TRUNC: nothing is changed
    if (fd < 0)
      return detail::str_cat("exists but does not open for writing (", std::strerror(errno), ")");
    ::close(fd);
    return "";
  }
  if (errno != ENOENT) return std::strerror(errno);
  const std::string dir = parent_of(path);
  if (stat(dir.c_str(), &st) != 0)
    return detail::str_cat("directory '", dir, "' does not exist (", std::strerror(errno),
                           "); create it first");
  if (!S_ISDIR(st.st_mode)) return detail::str_cat("'", dir, "' is not a directory");
  return probe_directory(dir);
}

std::string output_dir_problem(const std::string& dir) {
  struct stat st {};
  if (stat(dir.c_str(), &st) == 0)
    return S_ISDIR(st.st_mode) ? probe_directory(dir) : "exists and is not a directory";
  if (errno != ENOENT) return std::strerror(errno);
  // Made on the first save: its nearest existing parent must take it.
  std::string parent = dir;
  do {
    while (parent.size() > 1 && parent.back() == '/') parent.pop_back();
    parent = parent_of(parent);
  } while (stat(parent.c_str(), &st) != 0 && errno == ENOENT && parent != "/" && parent != ".");
  if (stat(parent.c_str(), &st) != 0)
    return detail::str_cat("'", parent, "': ", std::strerror(errno));
  if (!S_ISDIR(st.st_mode))
    return detail::str_cat("'", parent, "' is not a directory, so it cannot be made");
  return probe_directory(parent);
}

void check_output_paths(const std::string& program, comm::Communicator& world,
                        const std::vector<OutputPath>& outputs) {
  std::string verdict;
  if (world.rank() == 0) {
    for (const auto& [flag, path, directory] : outputs) {
      if (path.empty()) continue;
      const std::string problem = directory ? output_dir_problem(path) : output_path_problem(path);
      if (!problem.empty()) {
        verdict = detail::str_cat(program, ": --", flag, " '", path, "': ", problem,
                                  directory ? " (checked before the first step)"
                                            : " (rank 0 writes it; checked before the first step)");
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
