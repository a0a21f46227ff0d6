// A program for tests/mpi/rank_death.sh: all ranks do one good allreduce, then rank 1 dies
// (`kill`: SIGKILL; `exit`: exits with status 3 without finalising MPI) while the others wait in
// a second allreduce. The survivors must fail with loom's message, and the job must end.
// Usage: rank_death {kill|exit} TIMEOUT_SECONDS [TAG] (TAG is ignored: it lets a test find its
// own processes)
#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <thread>

#include "collectives/communicator.h"

int main(int argc, char** argv) {
  if (argc != 3 && argc != 4) {
    std::fprintf(stderr, "usage: rank_death {kill|exit} TIMEOUT_SECONDS [TAG]\n");
    return 2;
  }
  const std::string mode = argv[1];
  auto world = loom::comm::world();
  world->set_timeout_seconds(std::atof(argv[2]));
  loom::Tensor x = loom::Tensor::ones({1024});
  world->allreduce_sync(x);
  if (world->rank() == 1) {
    // Die only once the others are surely inside the second allreduce's wait (they post it at
    // once); on a loaded machine a survivor could otherwise still be between the two calls.
    std::this_thread::sleep_for(std::chrono::seconds(1));
    if (mode == "kill") std::raise(SIGKILL);
    std::_Exit(3);
  }
  try {
    world->allreduce_sync(x);
  } catch (const loom::Error& e) {
    std::fprintf(stderr, "rank_death: %s\n", e.what());
    return 1;
  }
  std::fprintf(stderr, "rank_death: rank %d finished the allreduce without rank 1\n",
               world->rank());
  return 0;
}
