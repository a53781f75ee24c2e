// The course's cases (examples/cases/*/README.md) against the pipeflow they
// describe: every command of every case's README runs as written from the
// repository root and exits 0, and what the README pastes as its output is
// still what it prints. A new case folder is picked up without a change here.
//
// A case README's commands are its ```sh blocks (a line per command, `\` to
// continue one, `#` lines are comments), run in the README's order. An
// ```output block right after a ```sh block is what that block's last
// command printed: each of its lines must be a line of the output (standard
// output, then standard error; trailing spaces aside), in any order. In an
// ```output timed block (a measured run: times, tokens/s) the numbers are
// not compared, only the words around them: every number becomes `#` and
// runs of spaces one space, on both sides.

#include <gtest/gtest.h>

#include <algorithm>
#include <cctype>
#include <cstddef>
#include <filesystem>
#include <iostream>
#include <regex>
#include <string>
#include <vector>

#include "pipeflow/core/file.h"
#include "readme_commands.h"

namespace pipeflow::testing {
namespace {

const std::string kCasesDir = "examples/cases";

struct CaseCommand {
  std::string command;              // as the README writes it, continued lines joined
  std::size_t line = 0;             // its first line in the README, from 1
  std::vector<std::string> output;  // the ```output block pasted under it, if any
  bool timed = false;               // ```output timed: numbers left out of the comparison
};

std::string rstrip(std::string text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.pop_back();
  return text;
}

std::vector<CaseCommand> case_commands(const std::string& text) {
  const std::vector<std::string> lines = split_lines(text);
  std::vector<CaseCommand> commands;
  bool last_block_was_commands = false;
  for (std::size_t i = 0; i < lines.size(); ++i) {
    if (!starts_with(lines[i], "```")) {
      if (!rstrip(lines[i]).empty()) last_block_was_commands = false;
      continue;
    }
    const std::string info = rstrip(lines[i].substr(3));
    std::vector<std::string> block;
    const std::size_t first = i + 1;
    for (++i; i < lines.size() && !starts_with(lines[i], "```"); ++i) block.push_back(lines[i]);
    if (info == "sh") {
      std::string pending;
      for (std::size_t k = 0; k < block.size(); ++k) {
        const std::string line = rstrip(block[k]);
        if (pending.empty() && (line.empty() || line[0] == '#')) continue;
        if (pending.empty()) commands.push_back({"", first + k + 1, {}, false});
        if (!line.empty() && line.back() == '\\') {
          pending += line.substr(0, line.size() - 1);
          continue;
        }
        commands.back().command = pending + line;
        pending.clear();
      }
      last_block_was_commands = true;
    } else if ((info == "output" || info == "output timed") && last_block_was_commands) {
      commands.back().output = block;
      commands.back().timed = info == "output timed";
      last_block_was_commands = false;
    } else {
      last_block_was_commands = false;
    }
  }
  return commands;
}

// A measured line as compared: its numbers `#`, its runs of spaces one space.
std::string without_numbers(const std::string& line) {
  static const std::regex number(R"([0-9]+(\.[0-9]+)?)");
  static const std::regex spaces(" +");
  return std::regex_replace(std::regex_replace(line, number, "#"), spaces, " ");
}

std::vector<std::string> case_folders() {
  std::vector<std::string> folders;
  const std::filesystem::path root = std::filesystem::path(source_dir()) / kCasesDir;
  if (!std::filesystem::is_directory(root)) return folders;
  for (const auto& entry : std::filesystem::directory_iterator(root)) {
    if (std::filesystem::exists(entry.path() / "README.md")) folders.push_back(entry.path().filename().string());
  }
  std::sort(folders.begin(), folders.end());
  return folders;
}

TEST(Cases, TheIndexLinksEveryCaseFolderAndEveryCaseHasCommandsAndPastedOutput) {
  const std::vector<std::string> folders = case_folders();
  ASSERT_FALSE(folders.empty()) << "no " << kCasesDir << "/*/README.md";
  const std::string index = read_file(source_dir() + "/" + kCasesDir + "/README.md");
  for (const std::string& folder : folders) {
    EXPECT_NE(index.find("(" + folder + "/README.md)"), std::string::npos)
        << kCasesDir << "/README.md does not link " << folder << "/README.md";
    const std::vector<CaseCommand> commands =
        case_commands(read_file(source_dir() + "/" + kCasesDir + "/" + folder + "/README.md"));
    EXPECT_FALSE(commands.empty()) << folder << ": no ```sh block";
    EXPECT_TRUE(std::any_of(commands.begin(), commands.end(), [](const CaseCommand& c) { return !c.output.empty(); }))
        << folder << ": no ```output block under a command";
  }
}

TEST(Cases, AnOutputBlockBelongsToTheLastCommandAboveItAndTimedOnesCompareWords) {
  const std::string text =
      "Text.\n\n```sh\n# a comment\nbuild/release/pipeflow a \\\n  --b 1\nbuild/release/pipeflow c\n```\n\n"
      "```output\nline 1\n```\n\nprose\n\n```output\nnot pasted under a command\n```\n"
      "```sh\nd; echo \"exit status $?\"\n```\n```output timed\n1.5 ms\n```\n";
  const std::vector<CaseCommand> commands = case_commands(text);
  ASSERT_EQ(commands.size(), 3u);
  EXPECT_EQ(commands[0].command, "build/release/pipeflow a   --b 1");
  EXPECT_EQ(commands[0].line, 5u);
  EXPECT_TRUE(commands[0].output.empty());
  EXPECT_EQ(commands[1].output, std::vector<std::string>{"line 1"});
  EXPECT_FALSE(commands[1].timed);
  EXPECT_EQ(commands[2].command, "d; echo \"exit status $?\"");
  EXPECT_TRUE(commands[2].timed);
  EXPECT_EQ(without_numbers("step    12.5 ms, 3 ranks"), "step # ms, # ranks");
}

class CaseReadme : public ::testing::TestWithParam<std::string> {};

TEST_P(CaseReadme, EveryCommandRunsAsWrittenFromTheRepositoryRootAndPrintsItsPastedOutput) {
  const std::string folder = GetParam();
  const std::string readme = kCasesDir + "/" + folder + "/README.md";
  const std::vector<CaseCommand> commands = case_commands(read_file(source_dir() + "/" + readme));
  // Where the case's commands write (an ignored folder): what an earlier run left there goes first.
  const std::string runs = source_dir() + "/runs/cases/" + folder;
  std::filesystem::remove_all(runs);

  double total = 0;
  for (const CaseCommand& c : commands) {
    const std::string where = readme + ":" + std::to_string(c.line) + ": " + c.command;
    const ShellResult result = run_as_written(c.command);
    total += result.seconds;
    ASSERT_EQ(result.exit_code, 0) << where << "\n" << result.output;
    std::vector<std::string> printed;
    for (const std::string& line : split_lines(result.output)) {
      printed.push_back(c.timed ? without_numbers(rstrip(line)) : rstrip(line));
    }
    for (const std::string& pasted : c.output) {
      const std::string expected = c.timed ? without_numbers(rstrip(pasted)) : rstrip(pasted);
      if (expected.empty()) continue;
      EXPECT_NE(std::find(printed.begin(), printed.end(), expected), printed.end())
          << where << "\ndid not print the line \"" << expected << "\" that " << readme
          << " pastes as its output; it printed:\n"
          << result.output;
    }
    std::cout << "[ " << folder << " ] " << result.seconds << " s: " << c.command << "\n";
  }
  std::cout << "[ " << folder << " ] " << total << " s in all\n";
  std::filesystem::remove_all(runs);
}

INSTANTIATE_TEST_SUITE_P(ExamplesCases, CaseReadme, ::testing::ValuesIn(case_folders()),
                         [](const ::testing::TestParamInfo<std::string>& param) {
                           std::string name = param.param;
                           std::replace_if(name.begin(), name.end(), [](char c) { return std::isalnum(static_cast<unsigned char>(c)) == 0; }, '_');
                           return name;
                         });

}  // namespace
}  // namespace pipeflow::testing
