// The outermost frame of loom's programs: every failure ends as one line on stderr and exit
// status 1, never an abort. A loom::Error already says what was wrong; std::bad_alloc from a
// container sized by the command line gets `too_large`, the flags that could be to blame.
#pragma once

#include <cstdio>
#include <exception>
#include <new>

#include "core/error.h"

namespace loom::cli {

template <typename Fn>
int guarded_main(const char* program, const char* too_large, Fn&& run) {
  try {
    return run();
  } catch (const std::bad_alloc&) {
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%s: error: out of memory (std::bad_alloc): a size on the command line (%s) is "
                 "too large for this machine\n",
                 program, too_large);
  } catch (const std::exception& e) {  // loom::Error included
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", program, e.what());
  }
  return 1;
}

}  // namespace loom::cli
