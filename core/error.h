// Errors. LOOM_CHECK is for the user's mistakes: it throws loom::Error with the operation, the
// argument, expected vs actual, and the rank. LOOM_ASSERT is for loom's own invariants.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace loom {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

// The rank printed in error messages. Defaults to the launcher's rank variable
// (OMPI_COMM_WORLD_RANK / PMI_RANK) when present, else 0; the communicator sets it once known.
int error_rank();
void set_error_rank(int rank);

namespace detail {

template <typename... Args>
std::string str_cat(const Args&... args) {
  std::ostringstream os;
  (os << ... << args);
  return os.str();
}

[[noreturn]] void throw_error(const std::string& msg, const char* file, int line);
[[noreturn]] void throw_internal(const char* cond, const std::string& msg, const char* file,
                                 int line);

}  // namespace detail
}  // namespace loom

#define LOOM_CHECK(cond, ...)                                                                \
  do {                                                                                       \
    if (!(cond))                                                                             \
      ::loom::detail::throw_error(::loom::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define LOOM_ASSERT(cond, ...)                                                                \
  do {                                                                                        \
    if (!(cond))                                                                              \
      ::loom::detail::throw_internal(                                                         \
          #cond, ::loom::detail::str_cat("" __VA_OPT__(, ) __VA_ARGS__), __FILE__, __LINE__); \
  } while (0)

#define LOOM_FAIL(...) \
  ::loom::detail::throw_error(::loom::detail::str_cat(__VA_ARGS__), __FILE__, __LINE__)
