// libFuzzer target: checkpoint manifests (core/io/checkpoint_manifest.h), parsed from memory.
#include <string>

#include "core/io/checkpoint_manifest.h"
#include "fuzz_input.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return loom::fuzz::only_loom_errors([&] {
    (void)loom::io::parse_checkpoint_manifest(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz/manifest.json");
  });
}
