// Shared by the fuzz targets: the input as a file (the loaders take paths) in /dev/shm, one per
// process, rewritten for every input; and the rule every target enforces: a loom::Error is the
// only acceptable failure (anything else, a crash, a sanitizer report or a hang, is a finding).
#pragma once

#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <string>

#include "core/error.h"

namespace loom::fuzz {

inline const std::string& input_path(const char* suffix) {
  static const std::string path =
      "/dev/shm/loom-fuzz-" + std::to_string(::getpid()) + std::string(suffix);
  return path;
}

inline const std::string& as_file(const uint8_t* data, size_t size, const char* suffix) {
  const std::string& path = input_path(suffix);
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) __builtin_trap();
  if (size && std::fwrite(data, 1, size, f) != size) __builtin_trap();
  std::fclose(f);
  return path;
}

template <typename Fn>
int only_loom_errors(Fn&& fn) {
  try {
    fn();
  } catch (const Error&) {  // a clear refusal: what bad input must get
  }
  return 0;
}

}  // namespace loom::fuzz
