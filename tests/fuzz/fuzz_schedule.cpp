// libFuzzer target: the pipeline schedule text form (parallel/pipeline/schedule.h), parsed from
// memory and, when it parses, validated (the validator simulates it: a cycle must be an error,
// not a hang).
#include <string>

#include "fuzz_input.h"
#include "parallel/pipeline/schedule.h"
#include "parallel/pipeline/validator.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  return loom::fuzz::only_loom_errors([&] {
    const auto s = loom::parallel::pipeline::parse_schedule(
        std::string(reinterpret_cast<const char*>(data), size), "fuzz");
    (void)loom::parallel::pipeline::validate(s);
  });
}
