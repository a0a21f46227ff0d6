// JSON from outside (safetensors headers, checkpoint manifests, Hugging Face configs), parsed
// with limits: nlohmann's parser itself is iterative, but anything that walks a value
// recursively (dump(), comparisons, copies) would overflow the stack on a crafted file nested
// tens of thousands of levels deep. No format loom reads nests deeper than a few levels.
#pragma once

#include <cstddef>
#include <nlohmann/json.hpp>
#include <string>

namespace loom::io::detail {

constexpr int kMaxJsonDepth = 64;

// Parses `text`; throws loom::Error starting with `what` ("safetensors file x.safetensors: the
// header") when it is not valid JSON or nests deeper than kMaxJsonDepth arrays and objects.
nlohmann::json parse_json(const std::string& text, const std::string& what);

// A value as it reads in an error message: its JSON, cut to about `max_chars` characters.
std::string json_excerpt(const nlohmann::json& value, size_t max_chars = 80);

}  // namespace loom::io::detail
