#include <gtest/gtest.h>

#include <filesystem>

#include "pipeflow/core/file.h"
#include "pipeflow/schedule/io.h"
#include "pipeflow/schedule/validate.h"
#include "run_pipeflow.h"

namespace pipeflow::testing {
namespace {

int count_lines_starting(const std::string& text, const std::string& prefix) {
  int n = 0;
  std::size_t at = 0;
  while (at < text.size()) {
    const std::size_t end = text.find('\n', at);
    if (text.compare(at, prefix.size(), prefix) == 0) ++n;
    if (end == std::string::npos) break;
    at = end + 1;
  }
  return n;
}

TEST(ScheduleCommand, ZbvGridIsPrintedWithItsSummary) {
  const CommandResult result = run_pipeflow("schedule --schedule zbv --stages 4 --microbatches 8");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(count_lines_starting(result.out, "rank "), 4);
  EXPECT_EQ(result.out.rfind("step     0      1      2", 0), 0u) << result.out;
  EXPECT_NE(result.out.find("rank 0   0F0    0F1    0F2    0F3    0F4    0F5    0F6    7F0    7I0    7W0"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("zbv: 4 ranks, 8 stages (v placement), 8 micro-batches, compute-only, 192 actions\n"
                            "unit-cost makespan 51 (F=1, B=2, I=W=1, no transfer time), bubble 5.9%\n"
                            "peak in-flight micro-batch chunks per rank: 8 8 8 8\n"
                            "peak in-flight until W per rank: 8 8 8 8\n"),
            std::string::npos)
      << result.out;
}

TEST(ScheduleCommand, CsvOutputValidatesAndLoweredAddsMessages) {
  const CommandResult result =
      run_pipeflow("schedule --schedule interleaved-1f1b --stages 4 --microbatches 8 --virtual 2 --format csv --lowered");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  const Schedule schedule = read_csv(result.out, "out.csv");
  EXPECT_EQ(schedule.num_stages(), 8);
  EXPECT_TRUE(schedule.has_communication());
  EXPECT_TRUE(validate(schedule).ok());
}

TEST(ScheduleCommand, OutputFileIsWrittenAtomically) {
  const std::string dir = make_temp_dir();
  const CommandResult result =
      run_pipeflow("schedule --schedule 1f1b --stages 2 --microbatches 2 --format csv -o " + dir + "/s.csv");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out, "");
  EXPECT_EQ(read_file(dir + "/s.csv"), "0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n");
  EXPECT_EQ(std::distance(std::filesystem::directory_iterator(dir), {}), 1);
}

TEST(ScheduleCommand, ListShowsEveryScheduleWithItsConstraints) {
  const CommandResult result = run_pipeflow("schedule --list");
  ASSERT_EQ(result.exit_code, 0) << result.err;
  for (const char* name : {"gpipe", "1f1b", "interleaved-1f1b", "looped-bfs", "zb-h1", "zb-h2", "zbv", "dualpipev"}) {
    EXPECT_EQ(count_lines_starting(result.out, std::string(name) + " "), 1) << name;
  }
  EXPECT_NE(result.out.find("constraints: microbatches >= 2 * stages; 2 chunks per rank"), std::string::npos);
  EXPECT_EQ(count_lines_starting(result.out, std::string(17, ' ') + " placement: v"), 2);
}

TEST(ScheduleCommand, ConstraintViolationIsOneLineAndExitsOne) {
  const CommandResult result = run_pipeflow("schedule --schedule 1f1b --stages 4 --microbatches 3");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: 1f1b needs microbatches >= stages (got 3 < 4): raise gradient_accumulation_steps or "
            "use gpipe\n");
  const CommandResult missing = run_pipeflow("schedule --schedule 1f1b");
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_NE(missing.err.find("--stages P and --microbatches M"), std::string::npos) << missing.err;
  // A given but impossible value is named by the generator's rule.
  const CommandResult zero = run_pipeflow("schedule --schedule 1f1b --stages 0 --microbatches 4");
  EXPECT_EQ(zero.exit_code, 1);
  EXPECT_EQ(zero.err, "pipeflow: error: 1f1b needs stages >= 1 (got 0): stages counts pipeline ranks\n");
}

TEST(ScheduleCommand, AHugeSizeFailsAtOnceInsteadOfRunningOutOfMemory) {
  const CommandResult result = run_pipeflow("schedule --schedule 1f1b --stages 99999999 --microbatches 99999999");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err,
            "pipeflow: error: schedule 1f1b is too large: 99999999 stages x 99999999 microbatches = 9999999800000001 "
            "(stage, micro-batch) pairs, more than the limit of 4194304: use fewer stages or microbatches\n");
}

TEST(ValidateCommand, GoodCsvPrintsOkAndTheSummary) {
  const CommandResult result =
      run_pipeflow("validate " + std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/pytorch_1f1b_4x8.csv");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out,
            "OK pytorch_1f1b_4x8.csv: 4 ranks, 4 stages (loop placement), 8 micro-batches, compute-only, 64 actions\n"
            "unit-cost makespan 33 (F=1, B=2, I=W=1, no transfer time), bubble 27.3%\n"
            "peak in-flight micro-batch chunks per rank: 4 3 2 1\n"
            "pytorch_1f1b_4x8.csv: read as PyTorch 2.7+'s CSV (B full backward, I/W split)\n");
}

TEST(ValidateCommand, SaysItReadPyTorch26sDialect) {
  const CommandResult result =
      run_pipeflow("validate " + std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/pytorch26_zbh1_2x4.csv");
  EXPECT_EQ(result.exit_code, 0) << result.err;
  EXPECT_EQ(result.out.rfind("OK pytorch26_zbh1_2x4.csv: 2 ranks, 2 stages (loop placement), 4 micro-batches", 0), 0u)
      << result.out;
  EXPECT_NE(
      result.out.find("\npytorch26_zbh1_2x4.csv: read as PyTorch 2.5-2.6's CSV (BW full backward, B/W split)\n"),
      std::string::npos)
      << result.out;
}

TEST(ValidateCommand, BadCsvPrintsEveryViolationWithTheGridAndExitsOne) {
  const std::string path = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/deadlock_2x1.csv";
  const CommandResult result = run_pipeflow("validate " + path);
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.out.find("[1] deadlock: rank 0 blocked at 0RECV_B0: waits for 1SEND_B0"), std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("rank 1  *1RECV_F0*  1F0        1B0        1SEND_B0   <-- ERROR HERE [2]"),
            std::string::npos)
      << result.out;
  EXPECT_EQ(result.err, "pipeflow: error: " + path + ": 2 violations (listed above)\n");
}

// A forward-only CSV is a training schedule missing its backwards unless
// --inference says otherwise; the JSON carries the mark itself.
TEST(ValidateCommand, InferenceAcceptsAForwardOnlyCsv) {
  const std::string dir = make_temp_dir();
  for (const char* format : {"csv", "json"}) {
    const std::string path = dir + "/prefill." + format;
    ASSERT_EQ(run_pipeflow("schedule --schedule inference --stages 3 --microbatches 4 --lowered --format " +
                           std::string(format) + " -o " + path)
                  .exit_code,
              0);
    const CommandResult plain = run_pipeflow("validate " + path);
    const CommandResult inference = run_pipeflow("validate --inference " + path);
    EXPECT_EQ(inference.exit_code, 0) << inference.out;
    const bool json = std::string(format) == "json";
    // A CSV's schedule is named after the file, a JSON's by its "name".
    EXPECT_EQ(inference.out.rfind(std::string("OK ") + (json ? "inference" : "prefill.csv") +
                                      ": inference (forward only), 3 ranks",
                                  0),
              0u)
        << inference.out;
    if (json) {
      EXPECT_EQ(plain.exit_code, 0) << plain.out;
    } else {
      EXPECT_EQ(plain.exit_code, 1);
      EXPECT_NE(plain.out.find("count: rank 0 step 0: stage 0 micro-batch 0 has no backward"), std::string::npos)
          << plain.out;
    }
  }
  const CommandResult grid = run_pipeflow("schedule --schedule inference --stages 2 --microbatches 3");
  ASSERT_EQ(grid.exit_code, 0) << grid.err;
  EXPECT_NE(grid.out.find("unit-cost makespan 4 (F=1, B=2, I=W=1, no transfer time), bubble 25.0%\n"),
            std::string::npos)
      << grid.out;
  EXPECT_NE(run_pipeflow("schedule --list").out.find("inference         forward only"), std::string::npos);
}

TEST(ValidateCommand, MalformedCsvNamesRowColumnAndToken) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/bad.csv", "0F0,0B0\n1F0,1Z0,1B0\n");
  const CommandResult result = run_pipeflow("validate " + dir + "/bad.csv");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.err.rfind("pipeflow: error: bad.csv row 2, column 2: invalid action \"1Z0\"", 0), 0u) << result.err;
}

TEST(ValidateCommand, SeveralFilesAreEachCheckedAndTheFailuresListedAtTheEnd) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/bad.csv", "0F0,0Z0\n");
  const std::string examples = std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/";
  const CommandResult result = run_pipeflow("validate " + examples + "pytorch_1f1b_4x8.csv " + dir + "/bad.csv " +
                                            examples + "deadlock_2x1.csv");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_NE(result.out.find("== " + examples + "pytorch_1f1b_4x8.csv\nOK pytorch_1f1b_4x8.csv: 4 ranks"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("== " + dir + "/bad.csv\ncannot check it: bad.csv row 1, column 2: invalid action"),
            std::string::npos)
      << result.out;
  EXPECT_NE(result.out.find("== " + examples + "deadlock_2x1.csv\n"), std::string::npos) << result.out;
  EXPECT_EQ(result.err, "pipeflow: error: 2 of 3 files failed: " + dir + "/bad.csv (unreadable), " + examples +
                            "deadlock_2x1.csv (2 violations)\n");
}

TEST(ValidateCommand, StageOnTwoRowsIsAViolationOnTheGridNotAReadError) {
  const std::string dir = make_temp_dir();
  write_file_atomic(dir + "/two_rows.csv", "0F0,0B0\n0F1,0B1\n");
  const CommandResult result = run_pipeflow("validate " + dir + "/two_rows.csv");
  EXPECT_EQ(result.exit_code, 1);
  EXPECT_EQ(result.out,
            "two_rows.csv: 2 ranks, 2 stages (loop placement), 2 micro-batches, compute-only, 4 actions\n"
            "8 violations:\n"
            "[1] placement: rank 1 step 0: 0F1 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s "
            "on rank s % 2): move it to rank 0 or correct its stage\n"
            "[2] placement: rank 1 step 1: 0B1 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s "
            "on rank s % 2): move it to rank 0 or correct its stage\n"
            "[3] count: stage 1 micro-batch 0 has no forward (1F0)\n"
            "[4] count: stage 1 micro-batch 0 has no backward: it needs 1B0, or 1I0 and 1W0\n"
            "[5] count: stage 1 micro-batch 1 has no forward (1F1)\n"
            "[6] count: stage 1 micro-batch 1 has no backward: it needs 1B1, or 1I1 and 1W1\n"
            "[7] deadlock: rank 0 blocked at 0B0: waits for 1B0, which is in no rank's list\n"
            "[8] deadlock: rank 1 blocked at 0B1: waits for 1B1, which is in no rank's list\n"
            "\n"
            "step     0      1\n"
            "rank 0   0F0   *0B0*   <-- ERROR HERE [7]\n"
            "rank 1  *0F1*  *0B1*   <-- ERROR HERE [1] [2] [8]\n"
            "two_rows.csv: read as PyTorch 2.7+'s CSV (B full backward, I/W split)\n");
  EXPECT_EQ(result.err, "pipeflow: error: " + dir + "/two_rows.csv: 8 violations (listed above)\n");
}

}  // namespace
}  // namespace pipeflow::testing
