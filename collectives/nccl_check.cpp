#include "collectives/nccl_check.h"

#include <cstring>

namespace loom::comm {

std::string nccl_failure(ncclResult_t code, ncclComm_t comm, const std::string& what,
                         const std::string& context) {
  // The last-error text is NCCL's detail ("peer 3 closed the connection", ...); it may be empty,
  // or left from an earlier failure, so it comes after the error string of this result.
  const char* last = ncclGetLastError(comm);
  std::string extra = last != nullptr && *last != '\0' ? detail::str_cat(" (", last, ")") : "";
  return detail::str_cat("[rank ", error_rank(), "] ", what, ": ", ncclGetErrorString(code), extra,
                         context.empty() ? "" : " in ", context);
}

ncclResult_t check_nccl(ncclResult_t code, ncclComm_t comm, const char* call, const char* file,
                        int line, const std::string& context) {
  if (code == ncclSuccess || code == ncclInProgress) return code;
  const char* paren = std::strchr(call, '(');
  std::string name = paren ? std::string(call, size_t(paren - call)) : std::string(call);
  const char* slash = std::strrchr(file, '/');
  throw CommError(detail::str_cat(nccl_failure(code, comm, name + " failed", context), " (",
                                  slash ? slash + 1 : file, ":", line, ")"));
}

}  // namespace loom::comm
