#include "pipeflow/schedule/io.h"

#include <algorithm>
#include <cctype>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>
#include <vector>

#include "pipeflow/core/config.h"
#include "pipeflow/core/text.h"
#include "pipeflow/core/error.h"
#include "pipeflow/core/file.h"
#include "pipeflow/core/json.h"
#include "pipeflow/core/units.h"

namespace pipeflow {
namespace {

// Bounds on what a file may ask for, so that a typo cannot demand gigabytes.
constexpr int kMaxStage = 1 << 16;
constexpr int kMaxMicrobatch = 1 << 20;
// Each rank holds a stage of its own, so no file has more rank rows than stages.
constexpr std::size_t kMaxRows = kMaxStage;
// The longest action cell, "(65535F1048575;65535B1048575)OVERLAP_F_B", has 41
// characters; a longer cell is no action (binary data, another file format).
constexpr std::size_t kMaxCellChars = 64;
// Far above any real schedule (a lowered 1F1B on 64 ranks with 1024
// micro-batches is about 4 MB of CSV), so that reading stays fast and bounded.
constexpr std::size_t kMaxScheduleFileBytes = std::size_t{64} << 20;

// The lines of `text`; the final line end closes the last line.
std::vector<std::string_view> split_lines(std::string_view text, const std::string& source) {
  std::vector<std::string_view> lines;
  while (!text.empty()) {
    if (lines.size() == kMaxRows) {
      fail("{}: more than {} rows, the limit of ranks (a row per rank): is it a schedule CSV?", source, kMaxRows);
    }
    const std::size_t end = text.find('\n');
    std::string_view line = text.substr(0, end);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    lines.push_back(line);
    if (end == std::string_view::npos) break;
    text.remove_prefix(end + 1);
  }
  return lines;
}

// Calls `visit(column, cell)` for each cell of one CSV line, unquoting "..."
// cells as Python's csv module writes them. Cells are visited as they end
// rather than collected, so a line of a million empty cells costs no memory.
template <class Visit>
void for_each_cell(std::string_view line, const std::string& where, Visit visit) {
  std::string cell;
  std::size_t column = 1;
  std::size_t cell_begin = 0;
  bool quoted = false;
  const auto end_cell = [&](std::size_t end) {
    if (cell.size() > kMaxCellChars) {
      fail("{}, column {}: cell {} is longer than any action ({} characters at most): is it a schedule CSV?", where,
           column, quoted_excerpt(line.substr(cell_begin, end - cell_begin)), kMaxCellChars);
    }
    visit(column, std::string_view(cell));
    cell.clear();
    ++column;
    cell_begin = end + 1;
  };
  for (std::size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (quoted) {
      if (c == '"' && i + 1 < line.size() && line[i + 1] == '"') {
        cell += '"';
        ++i;
      } else if (c == '"') {
        quoted = false;
      } else {
        cell += c;
      }
    } else if (c == '"') {
      quoted = true;
    } else if (c == ',') {
      end_cell(i);
    } else {
      cell += c;
    }
  }
  if (quoted) fail("{}: unterminated quoted cell", where);
  end_cell(line.size());
}

bool is_ignored_pytorch_action(std::string_view token) {
  std::size_t digits = 0;
  while (digits < token.size() && std::isdigit(static_cast<unsigned char>(token[digits]))) ++digits;
  if (digits == 0) return false;
  std::string_view rest = token.substr(digits);
  for (std::string_view kind : {"UNSHARD", "RESHARD", "REDUCE_GRAD"}) {
    if (rest.starts_with(kind)) {
      const std::string_view tail = rest.substr(kind.size());
      return std::all_of(tail.begin(), tail.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    }
  }
  return false;
}

Action checked(Action action, std::string_view token) {
  if (action.stage.value() >= kMaxStage) fail("stage {} in \"{}\" exceeds the limit {}", action.stage.value(), token, kMaxStage);
  if (action.microbatch.value() >= kMaxMicrobatch) {
    fail("micro-batch {} in \"{}\" exceeds the limit {}", action.microbatch.value(), token, kMaxMicrobatch);
  }
  return action;
}

// One action as a cell spelt it: the dialects differ only in the backward
// tokens, so the reader keeps what tells them apart until the whole file is read.
struct CellAction {
  Action action;  // B for both "B" and "BW" until the dialect is known
  bool spelt_bw = false;
  bool in_overlap = false;
  std::size_t row = 0;     // 0-based
  std::size_t column = 0;  // 0-based
};

// "2BW0": PyTorch 2.5-2.6's full backward, read as a B (spelt_bw).
std::optional<Action> parse_full_backward_bw(std::string_view token) {
  const std::size_t bw = token.find("BW");
  if (bw == 0 || bw == std::string_view::npos) return std::nullopt;
  const std::string_view stage = token.substr(0, bw);
  const std::string_view microbatch = token.substr(bw + 2);
  const auto all_digits = [](std::string_view text) {
    return !text.empty() &&
           std::all_of(text.begin(), text.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
  };
  if (!all_digits(stage) || !all_digits(microbatch)) return std::nullopt;
  return parse_action(fmt::format("{}B{}", stage, microbatch));
}

// One CSV cell: nothing (an idle step or an ignored action), one action, or
// the sub-actions of an OVERLAP_F_B.
void parse_cell(std::string_view cell, CellAction at, std::vector<CellAction>& out, int& ignored) {
  const std::string_view token = trim(cell);
  if (token.empty()) return;
  if (token.front() == '(') {
    const std::size_t close = token.find(')');
    if (close == std::string_view::npos || token.substr(close + 1) != "OVERLAP_F_B") {
      fail("invalid action \"{}\": a parenthesised cell must be (a;b)OVERLAP_F_B", token);
    }
    at.in_overlap = true;
    std::string_view inner = token.substr(1, close - 1);
    while (!inner.empty()) {
      const std::size_t semicolon = inner.find(';');
      parse_cell(inner.substr(0, semicolon), at, out, ignored);
      if (semicolon == std::string_view::npos) break;
      inner.remove_prefix(semicolon + 1);
    }
    return;
  }
  if (is_ignored_pytorch_action(token)) {
    ++ignored;
    return;
  }
  const std::optional<Action> full_backward = parse_full_backward_bw(token);
  at.spelt_bw = full_backward.has_value();
  at.action = checked(full_backward ? *full_backward : parse_action(token), token);
  out.push_back(at);
}

std::string cell_text(const CellAction& cell) {
  std::string token = to_string(cell.action);
  if (cell.spelt_bw) token = fmt::format("{}BW{}", cell.action.stage.value(), cell.action.microbatch.value());
  return fmt::format("row {}, column {} (\"{}\"{})", cell.row + 1, cell.column + 1, token,
                     cell.in_overlap ? ", in an OVERLAP_F_B cell" : "");
}

// The first cell only PyTorch 2.7+ writes: an I, or an OVERLAP_F_B cell.
const CellAction* first_current_marker(const std::vector<std::vector<CellAction>>& rows) {
  for (const auto& row : rows) {
    for (const CellAction& cell : row) {
      if (cell.action.kind == ActionKind::kBackwardInput || cell.in_overlap) return &cell;
    }
  }
  return nullptr;
}

// The first cell only PyTorch 2.5-2.6 writes: a BW, or a W of a stage and
// micro-batch that also has a B.
const CellAction* first_legacy_marker(const std::vector<std::vector<CellAction>>& rows) {
  std::set<std::pair<int, int>> spelt_b;
  for (const auto& row : rows) {
    for (const CellAction& cell : row) {
      if (cell.spelt_bw) return &cell;
      if (cell.action.kind == ActionKind::kBackward) {
        spelt_b.emplace(cell.action.stage.value(), cell.action.microbatch.value());
      }
    }
  }
  for (const auto& row : rows) {
    for (const CellAction& cell : row) {
      if (cell.action.kind == ActionKind::kBackwardWeight &&
          spelt_b.contains({cell.action.stage.value(), cell.action.microbatch.value()})) {
        return &cell;
      }
    }
  }
  return nullptr;
}

CsvDialect detect_dialect(const std::vector<std::vector<CellAction>>& rows, const std::string& source) {
  const CellAction* current = first_current_marker(rows);
  const CellAction* legacy = first_legacy_marker(rows);
  if (current != nullptr && legacy != nullptr) {
    fail("{}: mixes PyTorch's two CSV dialects: {} is {} but {} is {} (a BW, or a W after a B of the same "
         "stage and micro-batch): dump the whole schedule with one PyTorch version",
         source, cell_text(*current), describe(CsvDialect::kPyTorch), cell_text(*legacy),
         describe(CsvDialect::kPyTorch2_5));
  }
  return legacy != nullptr ? CsvDialect::kPyTorch2_5 : CsvDialect::kPyTorch;
}

// The actions in pipeflow's IR: in PyTorch 2.5-2.6's dialect B is the
// backward for the input (I) and BW the full backward (B).
std::vector<Action> to_actions(const std::vector<CellAction>& row, CsvDialect dialect) {
  std::vector<Action> actions;
  actions.reserve(row.size());
  for (const CellAction& cell : row) {
    Action action = cell.action;
    if (dialect == CsvDialect::kPyTorch2_5 && action.kind == ActionKind::kBackward && !cell.spelt_bw) {
      action.kind = ActionKind::kBackwardInput;
    }
    actions.push_back(action);
  }
  return actions;
}

struct Shape {
  int stages = 0;
  int microbatches = 0;
  Placement placement = Placement::kLoop;
};

// Every stage up to the largest appears on some row: a gap means a missing row.
void check_no_stage_missing(const std::vector<std::vector<Action>>& rows, int stages, const std::string& source) {
  std::vector<bool> seen(static_cast<std::size_t>(stages), false);
  for (const auto& row : rows) {
    for (const Action& a : row) seen[static_cast<std::size_t>(a.stage.value())] = true;
  }
  for (int s = 0; s < stages; ++s) {
    if (!seen[static_cast<std::size_t>(s)]) {
      fail("{}: stage {} appears in no row, but stages go up to {}: is a rank's row missing?", source, s,
           stages - 1);
    }
  }
}

// The placement that puts the most actions on their stage's rank; loop on a
// tie (with one rank both place every stage alike), V only with 2 * ranks
// stages. A file that fits neither exactly, such as one with a stage on two
// rows, still loads: validate() reports each action off its stage's rank
// (rule "placement"), as it does for a JSON file's declared placement.
Placement infer_placement(const std::vector<std::vector<Action>>& rows, int stages, const std::string& source) {
  const int ranks = static_cast<int>(rows.size());
  auto actions_on_their_rank = [&](Placement placement) {
    const Schedule map(source, ranks, stages, 1, placement);
    std::size_t placed = 0;
    for (std::size_t r = 0; r < rows.size(); ++r) {
      for (const Action& a : rows[r]) placed += map.rank_of(a.stage).value() == static_cast<int>(r) ? 1 : 0;
    }
    return placed;
  };
  if (stages == 2 * ranks && actions_on_their_rank(Placement::kV) > actions_on_their_rank(Placement::kLoop)) {
    return Placement::kV;
  }
  return Placement::kLoop;
}

Shape infer_shape(const std::vector<std::vector<Action>>& rows, const std::string& source) {
  Shape shape;
  const int ranks = static_cast<int>(rows.size());
  std::size_t actions = 0;
  Action highest_microbatch;
  for (std::size_t r = 0; r < rows.size(); ++r) {
    if (rows[r].empty()) {
      fail("{}: row {} (rank {}) has no actions: every rank runs some (is a rank's row missing?)", source, r + 1, r);
    }
    actions += rows[r].size();
    for (const Action& a : rows[r]) {
      shape.stages = std::max(shape.stages, a.stage.value() + 1);
      if (a.microbatch.value() + 1 > shape.microbatches) {
        shape.microbatches = a.microbatch.value() + 1;
        highest_microbatch = a;
      }
    }
  }
  // Every micro-batch has a forward on every stage, so n actions hold at most
  // n micro-batches. A larger index is a typo, and the validator's tables
  // (per stage and micro-batch) would take gigabytes for it (fuzzing found 0F00999999).
  if (static_cast<std::size_t>(shape.microbatches) > actions) {
    fail("{}: {} names micro-batch {}, but a file of {} actions holds at most {} micro-batches (each needs a "
         "forward on every stage): is the index mistyped?",
         source, to_string(highest_microbatch), highest_microbatch.microbatch.value(), actions, actions);
  }
  check_no_stage_missing(rows, shape.stages, source);
  // Fewer stages than rows: rows share a stage (every row has actions). Each
  // rank still holds a stage of its own, so there are at least `ranks`
  // stages; validate() reports the shared stage's actions off its rank and
  // the stages no row runs.
  shape.stages = std::max(shape.stages, ranks);
  if (shape.stages % ranks != 0) {
    fail("{}: {} stages on {} ranks: every rank must hold the same number of stages", source, shape.stages, ranks);
  }
  shape.placement = infer_placement(rows, shape.stages, source);
  return shape;
}

std::string quoted(const std::string& text) { return json_text(nlohmann::json(text)); }

}  // namespace

std::string write_csv(const Schedule& schedule) {
  std::string out;
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const auto& actions = schedule.actions(RankId(r));
    for (std::size_t i = 0; i < actions.size(); ++i) {
      if (i > 0) out += ',';
      out += to_string(actions[i]);
    }
    out += "\r\n";
  }
  return out;
}

Schedule read_csv(std::string_view text, const std::string& source, CsvReadNotes* notes) {
  std::vector<std::vector<CellAction>> cells_by_row;
  int ignored = 0;
  const std::vector<std::string_view> lines = split_lines(text, source);
  for (std::size_t row = 0; row < lines.size(); ++row) {
    const std::string where = fmt::format("{} row {}", source, row + 1);
    cells_by_row.emplace_back();
    for_each_cell(lines[row], where, [&](std::size_t column, std::string_view cell) {
      CellAction at;
      at.row = row;
      at.column = column - 1;  // for_each_cell counts from 1, CellAction from 0
      try {
        parse_cell(cell, at, cells_by_row.back(), ignored);
      } catch (const Error& error) {
        fail("{}, column {}: {}", where, column, error.what());
      }
    });
  }
  if (cells_by_row.empty()) fail("{}: no rows: a schedule CSV has one row per rank", source);
  const CsvDialect dialect = detect_dialect(cells_by_row, source);
  std::vector<std::vector<Action>> rows;
  for (const auto& row : cells_by_row) rows.push_back(to_actions(row, dialect));
  const Shape shape = infer_shape(rows, source);
  Schedule schedule(source, static_cast<int>(rows.size()), shape.stages, shape.microbatches, shape.placement);
  for (std::size_t r = 0; r < rows.size(); ++r) {
    schedule.mutable_actions(RankId(static_cast<int>(r))) = std::move(rows[r]);
  }
  if (notes != nullptr) *notes = CsvReadNotes{dialect, ignored};
  return schedule;
}

std::string write_json(const Schedule& schedule) {
  std::string out = "{\n";
  out += fmt::format("  \"name\": {},\n", quoted(schedule.name()));
  out += fmt::format("  \"ranks\": {},\n", schedule.num_ranks());
  out += fmt::format("  \"stages\": {},\n", schedule.num_stages());
  out += fmt::format("  \"placement\": \"{}\",\n", to_string(schedule.placement()));
  out += fmt::format("  \"microbatches\": {},\n", schedule.num_microbatches());
  if (schedule.is_inference()) out += "  \"inference\": true,\n";
  out += "  \"actions\": [\n";
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    std::string row;
    for (const Action& a : schedule.actions(RankId(r))) {
      if (!row.empty()) row += ", ";
      row += fmt::format("\"{}\"", to_string(a));
    }
    out += fmt::format("    [{}]{}\n", row, r + 1 < schedule.num_ranks() ? "," : "");
  }
  return out + "  ]\n}\n";
}

Schedule read_json(std::string_view text, const std::string& source) {
  const Config config = Config::parse(text, source);
  const std::string placement_text = config.require<std::string>("placement");
  if (placement_text != "loop" && placement_text != "v") config.fail_value("placement", "must be \"loop\" or \"v\"");
  const nlohmann::json& actions = config.raw("actions");
  Schedule schedule(config.require<std::string>("name"), config.require<int>("ranks"), config.require<int>("stages"),
                    config.require<int>("microbatches"), placement_text == "v" ? Placement::kV : Placement::kLoop);
  schedule.set_inference(config.get("inference", false));
  config.check_no_unknown_keys();
  if (!actions.is_array() || static_cast<int>(actions.size()) != schedule.num_ranks()) {
    config.fail_value("actions", fmt::format("must be a list of {} lists of actions, one per rank", schedule.num_ranks()));
  }
  for (int r = 0; r < schedule.num_ranks(); ++r) {
    const nlohmann::json& row = actions[static_cast<std::size_t>(r)];
    if (!row.is_array()) config.fail_value("actions", fmt::format("rank {} is not a list of actions", r));
    for (std::size_t i = 0; i < row.size(); ++i) {
      if (!row[i].is_string()) fail("{}: actions[{}][{}] = {}: must be an action string like \"2F0\"", source, r, i, short_dump(row[i]));
      try {
        const std::string token = row[i].get<std::string>();
        schedule.add(RankId(r), checked(parse_action(token), token));
      } catch (const Error& error) {
        fail("{}: actions[{}][{}]: {}", source, r, i, error.what());
      }
    }
  }
  return schedule;
}

Schedule load_schedule_file(const std::filesystem::path& path, CsvReadNotes* notes) {
  const std::string text = read_file(path, kMaxScheduleFileBytes, "schedule file");
  if (notes != nullptr) *notes = CsvReadNotes{};
  if (path.extension() == ".json") return read_json(text, path.filename().string());
  return read_csv(text, path.filename().string(), notes);
}

std::string_view describe(CsvDialect dialect) {
  return dialect == CsvDialect::kPyTorch2_5 ? "PyTorch 2.5-2.6's CSV (BW full backward, B/W split)"
                                            : "PyTorch 2.7+'s CSV (B full backward, I/W split)";
}

std::string describe_schedule_file(const std::filesystem::path& path, const CsvReadNotes& notes) {
  if (path.extension() == ".json") return "";
  std::string line = fmt::format("{}: read as {}", path.filename().string(), describe(notes.dialect));
  if (notes.ignored_actions > 0) {
    line += fmt::format("; ignored {} (no pipeline actions)",
                        format_count(notes.ignored_actions, "UNSHARD/RESHARD/REDUCE_GRAD action"));
  }
  return line;
}

}  // namespace pipeflow
