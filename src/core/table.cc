#include "pipeflow/core/table.h"

#include <algorithm>
#include <cctype>

#include "pipeflow/core/error.h"

namespace pipeflow {
namespace {

bool looks_numeric(const std::string& cell) {
  return !cell.empty() && (std::isdigit(static_cast<unsigned char>(cell[0])) || cell[0] == '-' ||
                           cell[0] == '+' || cell[0] == '.');
}

}  // namespace

TextTable::TextTable(std::vector<std::string> header) : header_(std::move(header)) {}

void TextTable::add_row(std::vector<std::string> cells) {
  if (cells.size() != header_.size()) {
    fail("internal: table row has {} cells, header has {}", cells.size(), header_.size());
  }
  rows_.push_back(std::move(cells));
}

std::string TextTable::render() const {
  const std::size_t columns = header_.size();
  std::vector<std::size_t> width(columns);
  std::vector<bool> numeric(columns, !rows_.empty());
  for (std::size_t c = 0; c < columns; ++c) {
    width[c] = header_[c].size();
    for (const auto& row : rows_) {
      width[c] = std::max(width[c], row[c].size());
      numeric[c] = numeric[c] && looks_numeric(row[c]);
    }
  }
  auto line = [&](const std::vector<std::string>& cells) {
    std::string out;
    for (std::size_t c = 0; c < columns; ++c) {
      const std::string padding(width[c] - cells[c].size(), ' ');
      out += numeric[c] ? padding + cells[c] : cells[c] + padding;
      if (c + 1 < columns) out += "  ";
    }
    while (!out.empty() && out.back() == ' ') out.pop_back();
    return out + "\n";
  };
  std::string out = line(header_);
  std::vector<std::string> rule(columns);
  for (std::size_t c = 0; c < columns; ++c) rule[c] = std::string(width[c], '-');
  out += line(rule);
  for (const auto& row : rows_) out += line(row);
  return out;
}

}  // namespace pipeflow
