// A C++ program for tests/robustness/leave.sh: every rank runs allreduces in a loop; rank 1
// leaves the way MODE names while the others keep calling.
//   return1  after a few allreduces rank 1 fails a LOOM_CHECK, and main catches loom::Error and
//            returns 1 (what loom-gpt and loom-dlrm do with their errors)
//   signal   rank 1 writes its pid to PIDFILE and keeps going; the test signals it
// Usage: leave_cpp MODE TAG [PIDFILE] (TAG is ignored: it lets a test find its own processes)
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "collectives/communicator.h"

namespace {

int run(const std::string& mode, const std::string& pid_file) {
  auto world = loom::comm::world();
  if (mode == "signal" && world->rank() == 1) {
    const std::string tmp = pid_file + ".tmp";
    FILE* f = std::fopen(tmp.c_str(), "w");
    LOOM_CHECK(f != nullptr, "leave_cpp: cannot write ", tmp);
    std::fprintf(f, "%d", int(getpid()));
    std::fclose(f);
    std::rename(tmp.c_str(), pid_file.c_str());
  }
  loom::Tensor x = loom::Tensor::zeros({4});
  for (int i = 0; i < 1000000; ++i) {
    world->allreduce_sync(x);
    if (mode == "return1" && i == 5)
      LOOM_CHECK(world->rank() != 1, "leave_cpp: rank 1 fails a check on purpose");
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 3) {
    std::fprintf(stderr, "usage: leave_cpp {return1|signal} TAG [PIDFILE]\n");
    return 2;
  }
  try {
    return run(argv[1], argc > 3 ? argv[3] : "");
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "leave_cpp: error: %s\n", e.what());
    return 1;
  }
}
