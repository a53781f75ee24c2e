// pipeflow's own Chrome trace, its events built from the input's bytes:
// ranks (some outside the reader's range), starts and durations (negative,
// huge, overlapping), actions in any order (an action before its input, as
// clock skew between processes makes them), sends, receives and waits;
// through the reader and the whole analysis (phases, bubble, critical path,
// advice, text and HTML). The reader refuses what it must; what it accepts
// is analysed in bounded time and memory.
#include <nlohmann/json.hpp>

#include <array>
#include <cstring>
#include <string>

#include "fuzz_target.h"
#include "pipeflow/plan/analyze.h"
#include "pipeflow/trace/chrome_trace.h"

namespace {

class Bytes {
 public:
  explicit Bytes(std::string_view text) : text_(text) {}
  bool empty() const { return at_ >= text_.size(); }
  std::uint8_t byte() { return empty() ? 0 : static_cast<std::uint8_t>(text_[at_++]); }
  std::int32_t int32() {
    std::uint32_t value = 0;
    for (int i = 0; i < 4; ++i) value = value << 8 | byte();
    std::int32_t out = 0;
    std::memcpy(&out, &value, sizeof(out));
    return out;
  }

 private:
  std::string_view text_;
  std::size_t at_ = 0;
};

// A rank, mostly 0-3; now and then one the reader must refuse.
nlohmann::json rank_of(std::uint8_t b) {
  switch (b) {
    case 250: return 65536;
    case 251: return -1;
    case 252: return 2147483647;
    case 253: return 4294967296.0;
    case 254: return 1.5;
    default: return b % 4;
  }
}

void analyse(std::string_view input) {
  static constexpr std::array<const char*, 8> kKinds = {"F", "B", "I", "W", "SEND_F", "RECV_F", "SEND_B", "RECV_B"};
  static constexpr std::array<const char*, 8> kCategories = {"forward", "backward", "backward_input",
                                                             "backward_weight", "send", "recv", "send", "wait"};
  Bytes bytes(input);
  nlohmann::json events = nlohmann::json::array();
  for (int i = 0; i < 4; ++i) {
    events.push_back({{"name", "thread_name"}, {"ph", "M"}, {"pid", 0}, {"tid", i},
                      {"args", {{"name", "rank " + std::to_string(i)}}}});
  }
  while (!bytes.empty() && events.size() < 2000) {
    const nlohmann::json tid = rank_of(bytes.byte());
    const std::uint8_t kind = bytes.byte() % kKinds.size();
    const int stage = bytes.byte() % 4, microbatch = bytes.byte() % 8;
    const double ts = bytes.int32() / 16.0, dur = bytes.int32() / 16.0;
    const std::string action = std::to_string(stage) + kKinds[kind] + std::to_string(microbatch);
    events.push_back({{"name", action}, {"cat", kCategories[kind]}, {"ph", "X"}, {"pid", 0}, {"tid", tid},
                      {"ts", ts}, {"dur", dur}, {"args", {{"action", action}}}});
  }
  const nlohmann::json trace = {{"displayTimeUnit", "ms"},
                                {"otherData", {{"num_ranks", 4}, {"time_unit", "s"}, {"title", "fuzz"}}},
                                {"traceEvents", events}};
  pipeflow::TraceInput in;
  in.source = "fuzz.json";
  in.timeline = pipeflow::read_chrome_trace(trace.dump(), "fuzz.json");
  const pipeflow::Analysis analysis = pipeflow::analyze(in);
  static_cast<void>(pipeflow::analysis_text(analysis));
  static_cast<void>(pipeflow::analysis_html(analysis, in.timeline));
}

}  // namespace

PIPEFLOW_FUZZ_READER(analyse(text))
