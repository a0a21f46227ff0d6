#include "common/flags.h"

#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <sstream>

#include "core/error.h"

namespace loom::cli {

Flags::Flags(std::string program, std::string summary)
    : program_(std::move(program)), summary_(std::move(summary)) {}

void Flags::add_int(const std::string& name, int64_t def, const std::string& help) {
  flags_[name] = Flag{Kind::kInt, std::to_string(def), help, {}};
  order_.push_back(name);
}

void Flags::add_double(const std::string& name, double def, const std::string& help) {
  std::ostringstream os;
  os << def;
  flags_[name] = Flag{Kind::kDouble, os.str(), help, {}};
  order_.push_back(name);
}

void Flags::add_string(const std::string& name, const std::string& def, const std::string& help,
                       std::vector<std::string> choices) {
  flags_[name] = Flag{Kind::kString, def, help, std::move(choices)};
  order_.push_back(name);
}

void Flags::add_bool(const std::string& name, const std::string& help) {
  flags_[name] = Flag{Kind::kBool, "false", help, {}};
  order_.push_back(name);
}

void Flags::assign(const std::string& name, Flag& flag, const std::string& value) {
  switch (flag.kind) {
    case Kind::kInt: {
      char* end = nullptr;
      errno = 0;
      std::strtoll(value.c_str(), &end, 10);
      LOOM_CHECK(!value.empty() && *end == '\0' && errno == 0, program_, ": --", name,
                 " expects an integer, got '", value, "'");
      break;
    }
    case Kind::kDouble: {
      char* end = nullptr;
      const double v = std::strtod(value.c_str(), &end);
      LOOM_CHECK(!value.empty() && *end == '\0', program_, ": --", name, " expects a number, got '",
                 value, "'");
      // No loom flag means anything by inf or nan; taken, they would surface steps later as
      // nonsense ("got -nan").
      LOOM_CHECK(std::isfinite(v), program_, ": --", name, " expects a finite number, got '", value,
                 "'");
      break;
    }
    case Kind::kString:
      if (!flag.choices.empty()) {
        bool ok = false;
        std::string list;
        for (const auto& c : flag.choices) {
          ok = ok || c == value;
          list += (list.empty() ? "" : ", ") + c;
        }
        LOOM_CHECK(ok, program_, ": --", name, " must be one of {", list, "}, got '", value, "'");
      }
      break;
    case Kind::kBool:
      LOOM_CHECK(value == "true" || value == "false" || value == "1" || value == "0", program_,
                 ": --", name, " is a switch (true/false), got '", value, "'");
      break;
  }
  flag.value =
      (flag.kind == Kind::kBool) ? ((value == "true" || value == "1") ? "true" : "false") : value;
  flag.set = true;
}

bool Flags::parse(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::fputs(help().c_str(), stdout);
      return false;
    }
    LOOM_CHECK(arg.rfind("--", 0) == 0 && arg.size() > 2, program_, ": unexpected argument '", arg,
               "' (flags look like --name value; see --help)");
    std::string name = arg.substr(2), value;
    bool has_value = false;
    if (auto eq = name.find('='); eq != std::string::npos) {
      value = name.substr(eq + 1);
      name = name.substr(0, eq);
      has_value = true;
    }
    auto it = flags_.find(name);
    LOOM_CHECK(it != flags_.end(), program_, ": unknown flag --", name, " (see --help)");
    Flag& flag = it->second;
    if (!has_value) {
      if (flag.kind == Kind::kBool) {
        value = "true";
      } else {
        LOOM_CHECK(i + 1 < argc, program_, ": --", name, " needs a value");
        value = argv[++i];
      }
    }
    assign(name, flag, value);
  }
  return true;
}

const Flags::Flag& Flags::find(const std::string& name, Kind kind) const {
  auto it = flags_.find(name);
  LOOM_ASSERT(it != flags_.end(), "flag --", name, " was never declared");
  LOOM_ASSERT(it->second.kind == kind, "flag --", name, " read with the wrong type");
  return it->second;
}

bool Flags::takes_value(const std::string& name) const {
  auto it = flags_.find(name);
  return it != flags_.end() && it->second.kind != Kind::kBool;
}

int64_t Flags::get_int(const std::string& name) const {
  return std::strtoll(find(name, Kind::kInt).value.c_str(), nullptr, 10);
}
double Flags::get_double(const std::string& name) const {
  return std::strtod(find(name, Kind::kDouble).value.c_str(), nullptr);
}
const std::string& Flags::get_string(const std::string& name) const {
  return find(name, Kind::kString).value;
}
bool Flags::get_bool(const std::string& name) const {
  return find(name, Kind::kBool).value == "true";
}
bool Flags::was_set(const std::string& name) const {
  auto it = flags_.find(name);
  LOOM_ASSERT(it != flags_.end(), "flag --", name, " was never declared");
  return it->second.set;
}

std::string Flags::help() const {
  std::ostringstream os;
  os << "usage: " << program_ << " [flags]\n" << summary_ << "\n\nflags:\n";
  for (const auto& name : order_) {
    const Flag& f = flags_.at(name);
    std::string left = "  --" + name;
    if (f.kind != Kind::kBool)
      left += f.choices.empty() ? " X" : " {" + [&] {
        std::string s;
        for (const auto& c : f.choices) s += (s.empty() ? "" : ",") + c;
        return s;
      }() + "}";
    os << left;
    for (size_t pad = left.size(); pad < 34; ++pad) os << ' ';
    os << ' ' << f.help;
    if (f.kind != Kind::kBool && !f.value.empty()) os << " (default " << f.value << ")";
    os << "\n";
  }
  return os.str();
}

}  // namespace loom::cli
