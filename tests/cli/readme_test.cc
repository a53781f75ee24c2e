// README.md against the pipeflow it describes: each command of its quick
// start runs as written from the repository root and prints what the README
// says it prints, and its table of commands names every subcommand that
// `pipeflow --help` lists (and no other), each with a doc that exists.

#include <gtest/gtest.h>

#include <cstddef>
#include <filesystem>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "readme_commands.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

std::string readme_text() { return read_file(source_dir() + "/README.md"); }

// The index of the line `heading` exactly, or the number of lines when absent.
std::size_t find_heading(const std::vector<std::string>& lines, const std::string& heading) {
  std::size_t i = 0;
  while (i < lines.size() && lines[i] != heading) ++i;
  return i;
}

struct QuickStartCommand {
  std::string command;                // the line as the README writes it
  std::vector<std::string> expected;  // the "quoted" parts of the comment below it
};

// The first code block after "## Quick start": a command per line, each
// followed by a comment line saying what it prints; what that comment quotes
// ("like this") is what the output must contain.
std::vector<QuickStartCommand> quick_start_commands(const std::string& text) {
  const std::vector<std::string> lines = split_lines(text);
  std::size_t i = find_heading(lines, "## Quick start");
  while (i < lines.size() && !starts_with(lines[i], "```")) ++i;
  std::vector<QuickStartCommand> commands;
  for (++i; i < lines.size() && !starts_with(lines[i], "```"); ++i) {
    const std::string& line = lines[i];
    if (line.empty()) continue;
    if (line[0] != '#') {
      commands.push_back({line, {}});
      continue;
    }
    if (commands.empty()) continue;
    std::size_t quote_open = line.find('"');
    while (quote_open != std::string::npos) {
      const std::size_t quote_close = line.find('"', quote_open + 1);
      if (quote_close == std::string::npos) break;
      commands.back().expected.push_back(line.substr(quote_open + 1, quote_close - quote_open - 1));
      quote_open = line.find('"', quote_close + 1);
    }
  }
  return commands;
}

TEST(Readme, EveryQuickStartCommandRunsAsWrittenAndPrintsWhatTheReadmeSays) {
  const std::vector<QuickStartCommand> commands = quick_start_commands(readme_text());
  ASSERT_EQ(commands.size(), 6u) << "README.md: no \"## Quick start\" block of six commands";
  int under_mpirun = 0;
  for (const QuickStartCommand& c : commands) {
    // The executable named as the README names it, once.
    ASSERT_NE(c.command.find(kReadmeBinary), std::string::npos) << c.command;
    EXPECT_EQ(c.command.find(kReadmeBinary), c.command.rfind(kReadmeBinary)) << c.command;
    EXPECT_FALSE(c.expected.empty()) << "README.md quotes nothing of what this prints: " << c.command;
    if (starts_with(c.command, "mpirun ")) ++under_mpirun;
  }
  EXPECT_EQ(under_mpirun, 1);
  // What an earlier run of the quick start left there (an ignored folder).
  std::filesystem::remove_all(source_dir() + "/runs/quickstart");

  double total = 0;
  for (const QuickStartCommand& c : commands) {
    const ShellResult result = run_as_written(c.command);
    total += result.seconds;
    EXPECT_EQ(result.exit_code, 0) << c.command << "\n" << result.output;
    for (const std::string& expected : c.expected) {
      EXPECT_NE(result.output.find(expected), std::string::npos)
          << c.command << "\ndid not print \"" << expected << "\" (README.md says it does); it printed:\n"
          << result.output;
    }
    std::cout << "[ quick start ] " << result.seconds << " s: " << c.command << "\n";
  }
  std::cout << "[ quick start ] " << total << " s in all\n";
  std::filesystem::remove_all(source_dir() + "/runs/quickstart");
}

// CLI11's help: a "Subcommands:" heading (upper case in later versions), then
// a line per subcommand: two spaces, the name, its description.
std::set<std::string> subcommands_in_help(const std::string& help) {
  std::set<std::string> names;
  bool in_list = false;
  for (const std::string& line : split_lines(help)) {
    if (line == "Subcommands:" || line == "SUBCOMMANDS:") {
      in_list = true;
      continue;
    }
    if (!in_list) continue;
    if (line.empty() || line[0] != ' ') break;
    if (line.size() > 2 && starts_with(line, "  ") && line[2] != ' ') {
      names.insert(line.substr(2, line.find(' ', 2) - 2));
    }
  }
  return names;
}

struct TableRow {
  std::string command;
  std::string line;
};

// The rows of the table under "## Commands" whose first cell is a `command`.
std::vector<TableRow> command_table(const std::string& text) {
  const std::vector<std::string> lines = split_lines(text);
  std::vector<TableRow> rows;
  std::size_t i = find_heading(lines, "## Commands");
  for (++i; i < lines.size() && !starts_with(lines[i], "## "); ++i) {
    const std::string& line = lines[i];
    if (!starts_with(line, "| `")) continue;
    const std::size_t end = line.find('`', 3);
    if (end == std::string::npos) continue;
    rows.push_back({line.substr(3, end - 3), line});
  }
  return rows;
}

TEST(Readme, TheCommandTableNamesEverySubcommandOfHelpWithADocThatExists) {
  const CommandResult help = run_pipeflow("--help");
  ASSERT_EQ(help.exit_code, 0) << help.err;
  const std::set<std::string> subcommands = subcommands_in_help(help.out);
  ASSERT_TRUE(subcommands.count("train") == 1 && subcommands.count("simulate") == 1)
      << "no subcommands found in pipeflow --help:\n"
      << help.out;

  const std::vector<TableRow> rows = command_table(readme_text());
  std::set<std::string> in_table;
  for (const TableRow& row : rows) in_table.insert(row.command);
  for (const std::string& name : subcommands) {
    EXPECT_EQ(in_table.count(name), 1u) << "pipeflow --help lists \"" << name
                                        << "\", which README.md's table under \"## Commands\" does not name";
  }
  for (const TableRow& row : rows) {
    EXPECT_EQ(subcommands.count(row.command), 1u)
        << "README.md's command table names \"" << row.command << "\", which pipeflow --help does not list";
    // The doc it points to: docs/NAME.md, which exists.
    const std::size_t doc = row.line.find("docs/");
    ASSERT_NE(doc, std::string::npos) << "no doc for " << row.command << ": " << row.line;
    const std::size_t md = row.line.find(".md", doc);
    ASSERT_NE(md, std::string::npos) << row.line;
    const std::string path = row.line.substr(doc, md + 3 - doc);
    EXPECT_TRUE(std::filesystem::exists(source_dir() + "/" + path)) << row.command << ": " << path << " is missing";
  }
  EXPECT_EQ(rows.size(), in_table.size()) << "a command is named twice in README.md's table";
}

}  // namespace
}  // namespace pipeflow::testing
