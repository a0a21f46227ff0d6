#include "collectives/mpi_check.h"

#include <cstring>

namespace loom::comm {

std::string mpi_error_string(int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int length = 0;
  if (MPI_Error_string(code, text, &length) != MPI_SUCCESS)
    return detail::str_cat("MPI error code ", code);
  return std::string(text, size_t(length));
}

void check_mpi(int code, const char* call, const char* file, int line, const std::string& context) {
  if (code == MPI_SUCCESS) return;
  const char* paren = std::strchr(call, '(');
  std::string name = paren ? std::string(call, size_t(paren - call)) : std::string(call);
  const char* slash = std::strrchr(file, '/');
  throw CommError(detail::str_cat(
      "[rank ", error_rank(), "] ", name, " failed: ", mpi_error_string(code),
      context.empty() ? "" : " in ", context, " (", slash ? slash + 1 : file, ":", line, ")"));
}

}  // namespace loom::comm
