// Output files only rank 0 writes (--metrics-file, --save, --trace), and the checkpoint directory,
// are checked before the
// first step, on rank 0, and the verdict is broadcast, so a bad path fails every rank at once
// with the same message, instead of rank 0 failing alone (at the start, or after the whole run
// for --save) while the others wait for it. Nothing is created: the check is that the file, if
// it exists, is a writable regular file, and that its directory exists and is writable.
#pragma once

#include <string>
#include <vector>

#include "collectives/communicator.h"

namespace loom::cli {

// What is wrong with writing `path` here ("" when nothing is): the file, if it exists, must be a
// regular file that opens for writing, and its directory must exist and take a new file (tried
// by creating and removing a probe file: access(2) says yes to root on a read-only mount, or
// in /proc).
std::string output_path_problem(const std::string& path);
// The same for a directory an output goes into (--checkpoint-dir): it must be a directory that
// takes a new file, or, when it does not exist yet, its nearest existing parent must (the
// directories are made on the first save).
std::string output_dir_problem(const std::string& dir);

// An output flag and its value; `directory` for a flag naming a directory.
struct OutputPath {
  std::string flag, path;
  bool directory = false;
};

// Collective over `world`: rank 0 checks every non-empty path and broadcasts the first problem;
// every rank then throws loom::Error "<program>: --flag 'path': <problem>" and marks the exit as
// agreed (comm::agree_on_exit), so the job ends at once with MPI finalised.
void check_output_paths(const std::string& program, comm::Communicator& world,
                        const std::vector<OutputPath>& outputs);

}  // namespace loom::cli
