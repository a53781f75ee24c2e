#pragma once

#include <string>
#include <vector>

namespace pipeflow {

// A plain-text table for terminal reports: a header row, then rows of cells;
// text columns are left-aligned and columns whose cells all look numeric are
// right-aligned.
class TextTable {
 public:
  explicit TextTable(std::vector<std::string> header);
  void add_row(std::vector<std::string> cells);
  std::string render() const;

 private:
  std::vector<std::string> header_;
  std::vector<std::vector<std::string>> rows_;
};

}  // namespace pipeflow
