#pragma once

#include <filesystem>
#include <string>
#include <string_view>

#include "pipeflow/schedule/schedule.h"

namespace pipeflow {

// Schedule files.
//
// CSV is PyTorch torch.distributed.pipelining's format (_dump_csv/_load_csv,
// Python's csv module): no header, one row per rank in rank order, one cell
// per action in its text form (2F0, 1SEND_F4), rows ended by "\r\n".
// write_csv writes exactly that. read_csv also accepts what PyTorch writes
// beside it: empty cells (its idle steps, None; `""` for a row of one None),
// "\n" line ends, spaces around cells, an OVERLAP_F_B cell "(2F3;5B1)OVERLAP_F_B"
// (read as its sub-actions in order: the F, then the B), and the per-stage
// UNSHARD, RESHARD and REDUCE_GRAD actions of FSDP and data parallelism, which
// are no pipeline actions and are dropped (counted in `ignored_actions`).
//
// A CSV carries no header, so read_csv infers the shape: ranks = rows,
// stages = 1 + the largest stage (at least ranks), micro-batches = 1 + the
// largest micro-batch, and the placement that puts the most actions on their
// stage's rank (loop, stage s on rank s % ranks, unless V, rank r holding r
// and 2 * ranks - 1 - r, puts more). Actions on the wrong row -- a stage on
// two rows, or on a rank neither placement gives it -- are no read error:
// validate() reports each one (rule "placement") with every other violation,
// as it does for JSON. Malformed input throws Error naming the source, the
// row (1-based; row r + 1 is rank r), the column and the token; so do an
// empty row, a stage missing below the largest, and a stage count that is
// not a multiple of the rows.
//
// PyTorch has spelt the backward in two dialects, and read_csv reads both:
//   kPyTorch     (2.7 on): B full backward, I backward for the input, W for
//                the weights; OVERLAP_F_B cells (2.8 on).
//   kPyTorch2_5  (2.5, 2.6): BW full backward, B backward for the input, W
//                for the weights.
// A file is kPyTorch2_5 when it holds a BW, or a B and a W of the same stage
// and micro-batch (a W after a full backward has nothing left to compute,
// so no kPyTorch file holds both); otherwise kPyTorch (a file of F and B
// alone reads the same in both: B then is the full backward, without which
// it would be no complete step). A file that also holds an I or an
// OVERLAP_F_B cell mixes the dialects: an Error naming a cell of each.
enum class CsvDialect { kPyTorch, kPyTorch2_5 };

// "PyTorch 2.7+'s CSV (B full backward, I/W split)", "PyTorch 2.5-2.6's CSV (BW full backward, B/W split)".
std::string_view describe(CsvDialect dialect);

// What read_csv found beside the actions.
struct CsvReadNotes {
  CsvDialect dialect = CsvDialect::kPyTorch;
  int ignored_actions = 0;  // UNSHARD, RESHARD, REDUCE_GRAD
};

std::string write_csv(const Schedule& schedule);
Schedule read_csv(std::string_view text, const std::string& source, CsvReadNotes* notes = nullptr);

// JSON: {"name", "ranks", "stages", "placement": "loop"|"v", "microbatches",
// "inference" (optional, true for a forward-only schedule; written only
// then), "actions": [[text per action] per rank]}. A CSV cannot say it: read
// it, then set_inference (`pipeflow validate --inference`). read_json rejects unknown keys
// and names the key path of any bad value.
std::string write_json(const Schedule& schedule);
Schedule read_json(std::string_view text, const std::string& source);

// Reads a .json file as JSON and anything else as CSV; `notes` (CSV only)
// as read_csv's.
Schedule load_schedule_file(const std::filesystem::path& path, CsvReadNotes* notes = nullptr);

// One line on how a file was read, for a command to print: the CSV dialect
// and any dropped actions; empty for JSON.
std::string describe_schedule_file(const std::filesystem::path& path, const CsvReadNotes& notes);

}  // namespace pipeflow
