// libFuzzer target: GPT weight files by content (core/io/gpt_weights.h): llm.c model files and
// Hugging Face GPT-2 safetensors, as loom-gpt --init-from reads them.
#include "core/io/gpt_weights.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return loom::fuzz::only_loom_errors(
      [&] { (void)loom::io::load_gpt_weights(loom::fuzz::as_file(data, size, ".bin"), 2); });
}
