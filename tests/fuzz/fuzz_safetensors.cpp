// libFuzzer target: safetensors files (core/io/safetensors.h), as loom.load and --init-from
// read them.
#include "core/io/safetensors.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return loom::fuzz::only_loom_errors(
      [&] { (void)loom::io::read_safetensors(loom::fuzz::as_file(data, size, ".safetensors")); });
}
