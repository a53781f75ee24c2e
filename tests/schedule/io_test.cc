#include "pipeflow/schedule/io.h"

#include <gtest/gtest.h>

#include "../support/error_of.h"
#include "pipeflow/core/error.h"
#include "pipeflow/schedule/generators.h"
#include "pipeflow/schedule/passes.h"
#include "pipeflow/schedule/validate.h"

namespace pipeflow {
namespace {

std::string read_error(std::string_view csv) {
  return testing::error_of([&] { read_csv(csv, "bad.csv"); });
}

std::string json_error(std::string_view json) {
  return testing::error_of([&] { read_json(json, "bad.json"); });
}

// Same shape, same stage -> rank map, same lists. (With one rank, loop and V
// place every stage alike, so the placement itself may differ.)
void expect_same(const Schedule& a, const Schedule& b) {
  ASSERT_EQ(a.num_ranks(), b.num_ranks());
  ASSERT_EQ(a.num_stages(), b.num_stages());
  EXPECT_EQ(a.num_microbatches(), b.num_microbatches());
  if (a.num_ranks() > 1) {
    EXPECT_EQ(a.placement(), b.placement());
  }
  for (int s = 0; s < a.num_stages(); ++s) EXPECT_EQ(a.rank_of(StageId(s)), b.rank_of(StageId(s)));
  for (int r = 0; r < a.num_ranks(); ++r) EXPECT_EQ(a.actions(RankId(r)), b.actions(RankId(r))) << "rank " << r;
}

std::vector<Schedule> examples() {
  std::vector<Schedule> out;
  for (int p : {1, 2, 3, 4}) {
    out.push_back(make_gpipe(p, 3));
    out.push_back(make_1f1b(p, 2 * p));
    out.push_back(make_interleaved_1f1b(p, 2 * p, 2));
    out.push_back(make_looped_bfs(p, 3, 3));
    out.push_back(make_zb_h1(p, p + 1));
    out.push_back(make_zb_h2(p, 2 * p));
    out.push_back(make_zbv(p, 2 * p));
    out.push_back(make_dualpipev(p, 2 * p + 1));
  }
  return out;
}

TEST(Csv, WritesPyTorchsRowsExactly) {
  EXPECT_EQ(write_csv(make_1f1b(2, 2)), "0F0,0F1,0B0,0B1\r\n1F0,1B0,1F1,1B1\r\n");
  EXPECT_EQ(write_csv(insert_send_recv(make_gpipe(2, 1))),
            "0F0,0SEND_F0,0RECV_B0,0B0\r\n1RECV_F0,1F0,1B0,1SEND_B0\r\n");
}

TEST(Csv, RoundTripsEveryGeneratorComputeOnlyAndLowered) {
  for (const Schedule& schedule : examples()) {
    SCOPED_TRACE(fmt::format("{} p={}", schedule.name(), schedule.num_ranks()));
    expect_same(read_csv(write_csv(schedule), "x.csv"), schedule);
    const Schedule lowered = insert_send_recv(schedule);
    expect_same(read_csv(write_csv(lowered), "x.csv"), lowered);
  }
}

TEST(Csv, InfersVPlacementAndTheShape) {
  const Schedule read = read_csv(write_csv(make_zbv(3, 6)), "zbv.csv");
  EXPECT_EQ(read.placement(), Placement::kV);
  EXPECT_EQ(read.num_stages(), 6);
  EXPECT_EQ(read.num_microbatches(), 6);
  EXPECT_EQ(read.name(), "zbv.csv");
  const Schedule interleaved = read_csv(write_csv(make_interleaved_1f1b(3, 6, 2)), "i.csv");
  EXPECT_EQ(interleaved.placement(), Placement::kLoop);
  EXPECT_EQ(interleaved.chunks_per_rank(), 2);
}

TEST(Csv, EmptyRowMeansAMissingRank) {
  EXPECT_EQ(read_error("0F0,0B0\r\n\"\"\r\n"),
            "bad.csv: row 2 (rank 1) has no actions: every rank runs some (is a rank's row missing?)");
}

TEST(Csv, OverlapCellsExpandToTheirSubActionsAndFsdpActionsAreDropped) {
  CsvReadNotes notes;
  const Schedule schedule = read_csv(
      ",0F0, 0F1 ,,(0B0;0UNSHARD)OVERLAP_F_B,0B1,0REDUCE_GRAD\n"
      "1F0,(1F1;1B0)OVERLAP_F_B,1RESHARD,1B1\n",
      "torch.csv", &notes);
  EXPECT_EQ(notes.ignored_actions, 3);
  EXPECT_EQ(notes.dialect, CsvDialect::kPyTorch);
  EXPECT_EQ(write_csv(schedule), "0F0,0F1,0B0,0B1\r\n1F0,1F1,1B0,1B1\r\n");
  EXPECT_TRUE(validate(schedule).ok());
}

std::string examples_dir() { return std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/"; }

TEST(CsvDialects, TodaysSpellingIsReadAsIs) {
  CsvReadNotes notes;
  const Schedule schedule = read_csv(write_csv(make_zb_h1(2, 4)), "zb.csv", &notes);
  EXPECT_EQ(notes.dialect, CsvDialect::kPyTorch);
  expect_same(schedule, make_zb_h1(2, 4));
}

TEST(CsvDialects, PyTorch26sBThenWIsTheSplitBackward) {
  // PyTorch 2.6 wrote zero-bubble's I as B: a B and a W of one stage and
  // micro-batch (rows padded with idle cells, as PyTorch pads them).
  CsvReadNotes notes;
  const Schedule schedule = load_schedule_file(examples_dir() + "pytorch26_zbh1_2x4.csv", &notes);
  EXPECT_EQ(notes.dialect, CsvDialect::kPyTorch2_5);
  expect_same(schedule, make_zb_h1(2, 4));
  EXPECT_TRUE(validate(schedule).ok());
}

TEST(CsvDialects, PyTorch26sBWIsTheFullBackwardAlsoInALoweredFile) {
  CsvReadNotes notes;
  const Schedule schedule = load_schedule_file(examples_dir() + "pytorch26_1f1b_2x4_lowered.csv", &notes);
  EXPECT_EQ(notes.dialect, CsvDialect::kPyTorch2_5);
  expect_same(schedule, insert_send_recv(make_1f1b(2, 4)));
  EXPECT_TRUE(validate(schedule).ok());
  // One BW alone decides: its B's are the backward for the input.
  EXPECT_EQ(write_csv(read_csv("0F0,0F1,0BW0,0B1,0W1\n", "one_bw.csv")), "0F0,0F1,0B0,0I1,0W1\r\n");
}

TEST(CsvDialects, FAndBAloneReadAsTheFullBackward) {
  CsvReadNotes notes;
  read_csv("0F0,0B0\n1F0,1B0\n", "plain.csv", &notes);
  EXPECT_EQ(notes.dialect, CsvDialect::kPyTorch);
}

TEST(CsvDialects, AFileMixingTheDialectsNamesACellOfEach) {
  EXPECT_EQ(read_error("0F0,0F1,0I0,0W0,0BW1\n"),
            "bad.csv: mixes PyTorch's two CSV dialects: row 1, column 3 (\"0I0\") is PyTorch 2.7+'s CSV (B full "
            "backward, I/W split) but row 1, column 5 (\"0BW1\") is PyTorch 2.5-2.6's CSV (BW full backward, B/W "
            "split) (a BW, or a W after a B of the same stage and micro-batch): dump the whole schedule with one "
            "PyTorch version");
  EXPECT_EQ(read_error("0F0,0F1,0B0,0W0\n1F0,(1F1;1B0)OVERLAP_F_B,1B1\n"),
            "bad.csv: mixes PyTorch's two CSV dialects: row 2, column 2 (\"1F1\", in an OVERLAP_F_B cell) is "
            "PyTorch 2.7+'s CSV (B full backward, I/W split) but row 1, column 4 (\"0W0\") is PyTorch 2.5-2.6's "
            "CSV (BW full backward, B/W split) (a BW, or a W after a B of the same stage and micro-batch): dump the "
            "whole schedule with one PyTorch version");
}

TEST(CsvDialects, DescribeSaysWhichWasRead) {
  EXPECT_EQ(describe_schedule_file("x.csv", {CsvDialect::kPyTorch2_5, 2}),
            "x.csv: read as PyTorch 2.5-2.6's CSV (BW full backward, B/W split); ignored 2 "
            "UNSHARD/RESHARD/REDUCE_GRAD actions (no pipeline actions)");
  EXPECT_EQ(describe_schedule_file("x.json", {}), "");
}

TEST(Csv, TheCommittedPyTorchStyleExampleValidates) {
  const Schedule schedule =
      load_schedule_file(std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/pytorch_1f1b_4x8.csv");
  expect_same(schedule, make_1f1b(4, 8));
  EXPECT_TRUE(validate(schedule).ok());
}

TEST(Csv, MalformedInputNamesRowColumnAndToken) {
  EXPECT_EQ(read_error("0F0,0B0\n1F0,1X0,1B0\n"),
            "bad.csv row 2, column 2: invalid action \"1X0\": unknown action type in \"X0\"; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
  EXPECT_EQ(read_error("0F0,(0B0;0F1\n"),
            "bad.csv row 1, column 2: invalid action \"(0B0;0F1\": a parenthesised cell must be (a;b)OVERLAP_F_B");
  EXPECT_EQ(read_error("0F0,\"0B0\n"), "bad.csv row 1: unterminated quoted cell");
  EXPECT_EQ(read_error(""), "bad.csv: no rows: a schedule CSV has one row per rank");
  EXPECT_EQ(read_error("0F0,0B2000000\n"),
            "bad.csv row 1, column 2: micro-batch 2000000 in \"0B2000000\" exceeds the limit 1048576");
}

TEST(Csv, MissingRankRowIsNamed) {
  // 1F1B on 3 ranks with rank 1's row deleted: stage 1 is on no row.
  const std::string csv = write_csv(make_1f1b(3, 3));
  const std::size_t first = csv.find('\n');
  const std::size_t second = csv.find('\n', first + 1);
  EXPECT_EQ(read_error(csv.substr(0, first + 1) + csv.substr(second + 1)),
            "bad.csv: stage 1 appears in no row, but stages go up to 2: is a rank's row missing?");
}

std::vector<std::string> violations(const Schedule& schedule) {
  std::vector<std::string> out;
  for (const Violation& v : validate(schedule).violations) out.push_back(v.rule + ": " + v.message);
  return out;
}

TEST(Csv, AStageOnTwoRowsLoadsAndIsAPlacementViolation) {
  // Two rows, one stage: the schedule gets a stage per rank, loop placed, so
  // stage 0 belongs on rank 0 and rank 1's stage 1 never runs -- what the same
  // lists say as JSON with 2 stages.
  const Schedule csv = read_csv("0F0,0B0\n0F1,0B1\n", "two_rows.csv");
  EXPECT_EQ(csv.num_ranks(), 2);
  EXPECT_EQ(csv.num_stages(), 2);
  EXPECT_EQ(csv.num_microbatches(), 2);
  EXPECT_EQ(csv.placement(), Placement::kLoop);
  const std::vector<std::string> expected{
      "placement: rank 1 step 0: 0F1 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s on rank "
      "s % 2): move it to rank 0 or correct its stage",
      "placement: rank 1 step 1: 0B1 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s on rank "
      "s % 2): move it to rank 0 or correct its stage",
      "count: stage 1 micro-batch 0 has no forward (1F0)",
      "count: stage 1 micro-batch 0 has no backward: it needs 1B0, or 1I0 and 1W0",
      "count: stage 1 micro-batch 1 has no forward (1F1)",
      "count: stage 1 micro-batch 1 has no backward: it needs 1B1, or 1I1 and 1W1",
      "deadlock: rank 0 blocked at 0B0: waits for 1B0, which is in no rank's list",
      "deadlock: rank 1 blocked at 0B1: waits for 1B1, which is in no rank's list",
  };
  EXPECT_EQ(violations(csv), expected);
  const Schedule json = read_json(
      R"({"name": "j", "ranks": 2, "stages": 2, "placement": "loop", "microbatches": 2, )"
      R"("actions": [["0F0", "0B0"], ["0F1", "0B1"]]})",
      "two_rows.json");
  EXPECT_EQ(violations(json), expected);
}

TEST(Csv, AMisplacedActionIsReportedWithEveryOtherViolationOnTheGrid) {
  // 1F1B on 2 ranks with 0B1 on rank 1's row and rank 1's 1B1 before its 1F1.
  const Schedule schedule = read_csv("0F0,0F1,0B0\n1F0,1B0,1B1,1F1,0B1\n", "mixed.csv");
  EXPECT_EQ(validate(schedule).render(schedule),
            "mixed.csv: 2 ranks, 2 stages (loop placement), 2 micro-batches, compute-only, 8 actions\n"
            "3 violations:\n"
            "[1] placement: rank 1 step 4: 0B1 is on rank 1, but stage 0 sits on rank 0 (loop placement: stage s "
            "on rank s % 2): move it to rank 0 or correct its stage\n"
            "[2] order: rank 1 step 2: 1B1 runs before 1F1 (step 3): a stage's backward needs its forward first\n"
            "[3] deadlock: rank 1 blocked at 1B1: waits for 1F1, which comes later in its own list (step 3)\n"
            "\n"
            "step     0      1      2      3      4\n"
            "rank 0   0F0    0F1    0B0\n"
            "rank 1   1F0    1B0   *1B1*   1F1   *0B1*   <-- ERROR HERE [1] [2] [3]\n");
}

TEST(Csv, PlacementIsTheOneThatFitsMostActions) {
  const Schedule v = read_csv("0F0,3F0,3B0,0B0\n1F0,2F0,2B0,1B0\n", "v.csv");
  EXPECT_EQ(v.placement(), Placement::kV);
  EXPECT_TRUE(validate(v).ok());
  // Contiguous stages fit loop and V alike (4 of 8 actions each): loop, and
  // the four actions off their rank are violations.
  const Schedule contiguous = read_csv("0F0,1F0,1B0,0B0\n2F0,3F0,3B0,2B0\n", "contiguous.csv");
  EXPECT_EQ(contiguous.placement(), Placement::kLoop);
  const ValidationReport report = validate(contiguous);
  ASSERT_EQ(report.violations.size(), 4u);
  for (const Violation& violation : report.violations) EXPECT_EQ(violation.rule, "placement");
  EXPECT_EQ(report.violations[2].message,
            "rank 1 step 0: 2F0 is on rank 1, but stage 2 sits on rank 0 (loop placement: stage s on rank s % 2): "
            "move it to rank 0 or correct its stage");
  // V with one action off its rank: V still fits more (7 of 8) than loop (3).
  const Schedule mostly_v = read_csv("0F0,3F0,3B0,0B0,1B0\n1F0,2F0,2B0\n", "mostly_v.csv");
  EXPECT_EQ(mostly_v.placement(), Placement::kV);
  EXPECT_EQ(validate(mostly_v).violations.at(0).message,
            "rank 0 step 4: 1B0 is on rank 0, but stage 1 sits on rank 1 (v placement: rank r holds stages r and "
            "3 - r): move it to rank 1 or correct its stage");
}

TEST(Csv, StageCountMustBeAMultipleOfTheRows) {
  EXPECT_EQ(read_error("0F0,0B0\n1F0,1B0\n2F0,2B0,3F0,3B0\n"),
            "bad.csv: 4 stages on 3 ranks: every rank must hold the same number of stages");
}

TEST(Csv, DuplicateActionBackwardBeforeForwardAndDeadlockAreViolations) {
  const Schedule duplicate = read_csv("0F0,0F0,0B0\n", "dup.csv");
  EXPECT_EQ(validate(duplicate).violations.at(0).message,
            "rank 0 step 1: 0F0 appears twice (first at rank 0 step 0): each action runs once");
  const Schedule backward_first = read_csv("0F0,0B0\n1B0,1F0\n", "order.csv");
  EXPECT_EQ(validate(backward_first).violations.at(0).message,
            "rank 1 step 0: 1B0 runs before 1F0 (step 1): a stage's backward needs its forward first");
  const Schedule deadlock =
      load_schedule_file(std::string(PIPEFLOW_SOURCE_DIR) + "/examples/schedules/deadlock_2x1.csv");
  const ValidationReport report = validate(deadlock);
  ASSERT_EQ(report.violations.size(), 2u);
  EXPECT_EQ(report.violations[1].rule, "deadlock");
  EXPECT_EQ(report.violations[1].message,
            "rank 1 blocked at 1RECV_F0: waits for 0SEND_F0, which rank 0 has not reached (rank 0 is blocked at "
            "0RECV_B0)");
}

TEST(Json, RoundTripsEveryGenerator) {
  for (const Schedule& schedule : examples()) {
    SCOPED_TRACE(fmt::format("{} p={}", schedule.name(), schedule.num_ranks()));
    const Schedule read = read_json(write_json(schedule), "x.json");
    expect_same(read, schedule);
    EXPECT_EQ(read.placement(), schedule.placement());
    EXPECT_EQ(read.name(), schedule.name());
    const Schedule lowered = insert_send_recv(schedule);
    expect_same(read_json(write_json(lowered), "x.json"), lowered);
  }
}

TEST(Json, WritesTheDocumentedLayout) {
  EXPECT_EQ(write_json(make_1f1b(2, 2)),
            "{\n"
            "  \"name\": \"1f1b\",\n"
            "  \"ranks\": 2,\n"
            "  \"stages\": 2,\n"
            "  \"placement\": \"loop\",\n"
            "  \"microbatches\": 2,\n"
            "  \"actions\": [\n"
            "    [\"0F0\", \"0F1\", \"0B0\", \"0B1\"],\n"
            "    [\"1F0\", \"1B0\", \"1F1\", \"1B1\"]\n"
            "  ]\n"
            "}\n");
}

TEST(Json, AnImpossibleSizeIsAnErrorNotAnAllocation) {
  EXPECT_EQ(json_error(R"({"name": "x", "ranks": 1000000000, "stages": 1000000000, "microbatches": 1, )"
                       R"("placement": "loop", "actions": []})"),
            "schedule x is too large: 1000000000 stages x 1 microbatches = 1000000000 (stage, micro-batch) pairs, "
            "more than the limit of 4194304: use fewer stages or microbatches");
}

TEST(Json, ErrorsNameTheKeyPath) {
  const std::string good = write_json(make_1f1b(2, 2));
  std::string unknown = good;
  unknown.replace(unknown.find("\"ranks\""), 7, "\"rank\"");
  EXPECT_NE(json_error(unknown).find("rank"), std::string::npos);
  std::string placement = good;
  placement.replace(placement.find("\"loop\""), 6, "\"ring\"");
  EXPECT_EQ(json_error(placement), "bad.json: placement = \"ring\": must be \"loop\" or \"v\"");
  std::string token = good;
  token.replace(token.find("\"1B0\""), 5, "\"1Q0\"");
  EXPECT_EQ(json_error(token),
            "bad.json: actions[1][1]: invalid action \"1Q0\": unknown action type in \"Q0\"; expected "
            "[stage][F|I|B|W|SEND_F|RECV_F|SEND_B|RECV_B][micro-batch], e.g. 2F0 or 1SEND_F4");
}

TEST(HostileInput, ManyEmptyCellsCostNoMemoryPerCell) {
  // 8 MB of commas: each cell used to be a std::string (a 50 MB file took 2.1 GB).
  const std::string row = std::string(8'000'000, ',') + "0F0";
  const Schedule schedule = read_csv(row, "empty.csv");
  EXPECT_EQ(schedule.total_actions(), 1u);
}

TEST(HostileInput, ALongOrBinaryCellIsQuotedShort) {
  // The whole 100 KB cell used to be echoed.
  std::string first_bytes;
  for (int i = 0; i < 200; ++i) first_bytes += "\\x01";
  EXPECT_EQ(read_error(std::string(100'000, '\x01')),
            "bad.csv row 1, column 1: cell \"" + first_bytes +
                "\"... (100000 bytes) is longer than any action (64 characters at most): is it a schedule CSV?");
}

TEST(HostileInput, MoreRowsThanRanksCanBeIsAnError) {
  EXPECT_EQ(read_error(std::string(70'000, '\n')),
            "bad.csv: more than 65536 rows, the limit of ranks (a row per rank): is it a schedule CSV?");
}

TEST(HostileInput, DeepJsonIsAnErrorNotACrash) {
  EXPECT_NE(json_error(std::string(100'000, '[')).find("bad.json: JSON nested deeper than the limit of 64"),
            std::string::npos);
}

TEST(HostileInput, AnEndlessFileFailsAtTheScheduleFileLimit) {
  EXPECT_EQ(testing::error_of([] { load_schedule_file("/dev/zero"); }),
            "/dev/zero: more than 67108864 bytes, the limit for a schedule file: is it the right file?");
}

}  // namespace
}  // namespace pipeflow

namespace pipeflow {
namespace {

// Found by fuzz/schedule_csv_fuzz: one mistyped index sized the validator's
// tables by a million micro-batches (over 1 GB).
TEST(CsvReadLimits, AMicroBatchIndexBeyondWhatTheFileCanHoldIsAnError) {
  try {
    read_csv("0SEND_B0,0F00999999\n1F0,1F1,,,,0SEND_B0\n", "typo.csv");
    FAIL() << "no error";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(), "typo.csv: 0F999999 names micro-batch 999999, but a file of 5 actions holds at most 5 "
                               "micro-batches (each needs a forward on every stage): is the index mistyped?");
  }
}

}  // namespace
}  // namespace pipeflow
