#include "core/io/detail/json.h"

#include "core/error.h"

namespace loom::io::detail {

nlohmann::json parse_json(const std::string& text, const std::string& what) {
  bool too_deep = false;
  // The callback sees each value's depth as it starts; refusing there stops before the stack of
  // open containers grows any further.
  auto limit = [&too_deep](int depth, nlohmann::json::parse_event_t event, nlohmann::json&) {
    if (depth > kMaxJsonDepth && (event == nlohmann::json::parse_event_t::object_start ||
                                  event == nlohmann::json::parse_event_t::array_start)) {
      too_deep = true;
      throw std::length_error("too deep");
    }
    return true;
  };
  try {
    return nlohmann::json::parse(text, limit);
  } catch (const std::length_error&) {
    LOOM_CHECK(
        !too_deep, what, " nests arrays or objects more than ", kMaxJsonDepth,
        " levels deep (loom's limit; no valid file comes close): a damaged or crafted file?");
    throw;
  } catch (const nlohmann::json::exception& e) {
    LOOM_FAIL(what, " is not valid JSON (a damaged file?): ", e.what());
  }
}

std::string json_excerpt(const nlohmann::json& value, size_t max_chars) {
  std::string s = value.dump();
  if (s.size() > max_chars)
    s = s.substr(0, max_chars) + "... (" + std::to_string(s.size()) + " characters)";
  return s;
}

}  // namespace loom::io::detail
