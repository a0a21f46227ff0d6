// Output files only rank 0 writes (--metrics-file, --save, --trace) are checked before the
// first step, on rank 0, and the verdict is broadcast, so a bad path fails every rank at once
// with the same message, instead of rank 0 failing alone (at the start, or after the whole run
// for --save) while the others wait for it. Nothing is created: the check is that the file, if
// it exists, is a writable regular file, and that its directory exists and is writable.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "collectives/communicator.h"

namespace loom::cli {

// What is wrong with writing `path` here ("" when it looks writable).
std::string output_path_problem(const std::string& path);

// Collective over `world`: rank 0 checks every non-empty path of (flag, path) and broadcasts the
// first problem; every rank then throws loom::Error "<program>: --flag 'path': <problem>" and
// marks the exit as agreed (comm::agree_on_exit), so the job ends at once with MPI finalised.
void check_output_paths(const std::string& program, comm::Communicator& world,
                        const std::vector<std::pair<std::string, std::string>>& flag_paths);

}  // namespace loom::cli
