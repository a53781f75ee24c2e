#include "run_options.h"

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstdio>

#include "pipeflow/core/error.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/log.h"

namespace pipeflow::cli {

void RunFlags::add_to(CLI::App* app, std::initializer_list<FlagScope> scopes) {
  for (const RunKey& key : run_keys()) {
    if (key.flag.empty() || std::find(scopes.begin(), scopes.end(), key.scope) == scopes.end()) continue;
    add(app, key);
  }
}

void RunFlags::add_to(CLI::App* app, std::initializer_list<std::string_view> paths) {
  for (std::string_view path : paths) {
    const RunKey* key = find_run_key(path);
    if (key == nullptr || key->flag.empty()) fail("internal: run key {} has no flag", path);
    add(app, *key);
  }
}

void RunFlags::add(CLI::App* app, const RunKey& key) {
  const std::string names = key.aliases.empty() ? std::string(key.flag) : fmt::format("{},{}", key.flag, key.aliases);
  std::string fallback;  // as typed on a command line
  if (!key.fallback.empty()) {
    const nlohmann::json value = nlohmann::json::parse(key.fallback);
    fallback = value.is_string() ? value.get<std::string>() : json_text(value);
  }
  const std::string help = fmt::format("{} (key: {}; {}{})", key.help, key.path, key.rule,
                                       fallback.empty() ? "" : fmt::format("; default {}", fallback));
  CLI::Option* option = nullptr;
  if (key.type == KeyType::kBoolean) {
    option = app->add_flag(names, set_[key.path], help);
  } else {
    option = app->add_option(names, text_[key.path], help);
    option->type_name(key.type == KeyType::kInteger ? "INT" : key.type == KeyType::kNumber ? "FLOAT" : "TEXT");
  }
  flags_.push_back({&key, option});
}

RunOverrides RunFlags::overrides() const {
  RunOverrides o;
  for (const Flag& flag : flags_) {
    if (flag.option->count() == 0) continue;
    if (flag.key->type == KeyType::kBoolean) {
      o.set(flag.key->path, set_.at(flag.key->path));
    } else {
      o.set_text(*flag.key, text_.at(flag.key->path), flag.key->flag);
    }
  }
  return o;
}

void print_config_notes(const RunConfig& config) {
  for (const std::string& warning : config.warnings) log_warning("{}", warning);
  if (!config.not_modelled.empty()) {
    fmt::print(stderr, "{}: read, not modelled: {}\n", config.source, fmt::join(config.not_modelled, "; "));
  }
  if (!config.pipeline.file_note.empty()) fmt::print(stderr, "{}\n", config.pipeline.file_note);
}

RunConfig run_config_of(const std::string& config_path, const RunOverrides& overrides) {
  return config_path.empty() ? default_run_config(overrides) : load_run_config(config_path, overrides);
}

void refuse_launch_overhead_with_profile(double block_launch_overhead_s) {
  if (block_launch_overhead_s > 0) {
    fail("block_launch_overhead_s (--block-launch-overhead) = {}: --profile's measured durations already hold the "
         "run's host time; leave the overhead out with --profile",
         block_launch_overhead_s);
  }
}

}  // namespace pipeflow::cli
