#pragma once

#include <nlohmann/json_fwd.hpp>

#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pipeflow {

// The keys of the run configuration, one row each: the one table that the
// flag parser of every command that reads a run configuration (cli's
// RunFlags), `--help`, the command line's overrides (RunOverrides),
// `sweep --vary` and the planner's config writer read. parse_run_config
// checks each key's value and run_config_to_json writes it back; a test
// (tests/config/run_keys_test.cc) fails when a row is not read, written,
// defaulted or overridden as the row says.
//
// Adding a key: a row here, its field and check in run_config.h/.cc, its
// line in run_config_to_json, and its consumer.

// kStringOrObject: a value whose first non-blank character is "{" is a JSON
// object, any other the text itself (the model: a preset or path, or its
// keys inline).
enum class KeyType { kInteger, kNumber, kBoolean, kString, kList, kObject, kListOrObject, kStringOrObject };

// Which commands take the key's flag.
enum class FlagScope {
  kNone,      // the file only
  kAll,       // train, simulate, sweep: every command that reads a run configuration
  kTraining,  // train and sweep (with --train)
  kTrain,     // train alone
};

struct RunKey {
  std::string_view path;      // the JSON path, "pipeline.stages"
  std::string_view flag;      // "--stages"; empty: the file only
  std::string_view aliases;   // other names of the flag, comma-separated: "--pp"
  KeyType type = KeyType::kInteger;
  std::string_view rule;      // the values it takes, as --help and messages say them
  std::string_view fallback;  // the default as JSON; empty: absent (derived from other keys, or none)
  std::string_view help;      // one line
  FlagScope scope = FlagScope::kNone;
  bool vary = false;          // sweep --vary NAME may vary it (NAME: the flag without "--")
};

std::span<const RunKey> run_keys();

// The row of a JSON path, or nullptr.
const RunKey* find_run_key(std::string_view path);
// The row whose flag or alias is `name` ("--stages", "--pp"), or nullptr.
const RunKey* find_run_flag(std::string_view name);

// A value typed on a command line as the key's JSON: an integer, a number,
// true/false, the text itself, or a JSON list or object. An Error names `origin` (the flag as
// given), the text, the type and the key.
nlohmann::json run_key_value(const RunKey& key, std::string_view text, std::string_view origin);

// Command-line values written over a configuration's keys (absent: keep the
// file's), in the order given. Each names a row of run_keys().
class RunOverrides {
 public:
  // Defined in run_keys.cc, where nlohmann::json is complete: this header
  // needs only <nlohmann/json_fwd.hpp>.
  RunOverrides();
  RunOverrides(const RunOverrides&);
  RunOverrides(RunOverrides&&) noexcept;
  RunOverrides& operator=(const RunOverrides&);
  RunOverrides& operator=(RunOverrides&&) noexcept;
  ~RunOverrides();

  // Sets the key at `path` (an Error unless it is a row of run_keys()).
  void set(std::string_view path, nlohmann::json value);
  // The row's value from text (run_key_value).
  void set_text(const RunKey& key, std::string_view text, std::string_view origin);
  bool has(std::string_view path) const { return find(path) != nullptr; }
  const nlohmann::json* find(std::string_view path) const;
  bool empty() const;
  const std::vector<std::pair<std::string, nlohmann::json>>& values() const { return values_; }

 private:
  std::vector<std::pair<std::string, nlohmann::json>> values_;
};

}  // namespace pipeflow
