// A small command-line flag parser for loom's programs: `--name value` or `--name=value`,
// booleans as bare `--name`. Unknown flags, missing values and malformed numbers are loom::Errors
// that name the flag, so a typo never silently runs with a default.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace loom::cli {

class Flags {
 public:
  Flags(std::string program, std::string summary);

  // Declarations: the default is shown in --help. `choices` restricts a string flag.
  void add_int(const std::string& name, int64_t def, const std::string& help);
  void add_double(const std::string& name, double def, const std::string& help);
  void add_string(const std::string& name, const std::string& def, const std::string& help,
                  std::vector<std::string> choices = {});
  void add_bool(const std::string& name, const std::string& help);

  // Parses argv. Returns false when --help was asked (help already printed).
  bool parse(int argc, char** argv);

  int64_t get_int(const std::string& name) const;
  double get_double(const std::string& name) const;
  const std::string& get_string(const std::string& name) const;
  bool get_bool(const std::string& name) const;
  // True when the user passed the flag (as opposed to its default applying).
  bool was_set(const std::string& name) const;
  // Whether `--name` is a declared flag that takes a value (not a boolean): what a caller that
  // takes positional arguments out of argv first needs to know.
  bool takes_value(const std::string& name) const;

  std::string help() const;

 private:
  enum class Kind { kInt, kDouble, kString, kBool };
  struct Flag {
    Kind kind;
    std::string value;  // textual, validated at parse time
    std::string help;
    std::vector<std::string> choices;
    bool set = false;
  };
  const Flag& find(const std::string& name, Kind kind) const;
  void assign(const std::string& name, Flag& flag, const std::string& value);

  std::string program_;
  std::string summary_;
  std::map<std::string, Flag> flags_;
  std::vector<std::string> order_;
};

}  // namespace loom::cli
