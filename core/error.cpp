#include "core/error.h"

#include <atomic>
#include <cstdlib>

namespace loom {
namespace {

int rank_from_environment() {
  for (const char* name : {"OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"}) {
    if (const char* v = std::getenv(name)) return std::atoi(v);
  }
  return 0;
}

std::atomic<int>& rank_slot() {
  static std::atomic<int> rank{rank_from_environment()};
  return rank;
}

const char* basename_of(const char* path) {
  const char* base = path;
  for (const char* p = path; *p; ++p)
    if (*p == '/') base = p + 1;
  return base;
}

}  // namespace

int error_rank() { return rank_slot().load(); }
void set_error_rank(int rank) { rank_slot().store(rank); }

namespace detail {

void throw_error(const std::string& msg, const char* file, int line) {
  throw Error(str_cat("[rank ", error_rank(), "] ", msg, " (", basename_of(file), ":", line, ")"));
}

void throw_internal(const char* cond, const std::string& msg, const char* file, int line) {
  throw Error(str_cat("[rank ", error_rank(), "] internal error, please report: ", cond,
                      msg.empty() ? "" : ": ", msg, " (", basename_of(file), ":", line, ")"));
}

}  // namespace detail
}  // namespace loom
