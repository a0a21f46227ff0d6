// libFuzzer target: llm.c token files (core/io/token_file.h).
#include "core/io/token_file.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return loom::fuzz::only_loom_errors(
      [&] { (void)loom::io::read_token_file(loom::fuzz::as_file(data, size, ".tokens")); });
}
