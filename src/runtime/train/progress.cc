#include "pipeflow/runtime/progress.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "pipeflow/core/units.h"

namespace pipeflow::runtime {
namespace {

constexpr int kBarWidth = 20;

std::string tokens_rate(double tokens_per_s) {
  if (tokens_per_s >= 1e6) return fmt::format("{:.2f}M tok/s", tokens_per_s / 1e6);
  if (tokens_per_s >= 1e3) return fmt::format("{:.1f}k tok/s", tokens_per_s / 1e3);
  return fmt::format("{:.0f} tok/s", tokens_per_s);
}

}  // namespace

std::string format_eta(double seconds) {
  const auto s = static_cast<long>(std::lround(std::max(0.0, seconds)));
  if (s >= 3600) return fmt::format("{}h{:02}m", s / 3600, s % 3600 / 60);
  if (s >= 60) return fmt::format("{}m{:02}s", s / 60, s % 60);
  return fmt::format("{}s", s);
}

ProgressPrinter::ProgressPrinter(std::FILE* out, bool terminal, int total_steps, bool emulated, int every)
    : out_(out),
      terminal_(terminal),
      total_(std::max(1, total_steps)),
      every_(std::max(1, every)),
      emulated_(emulated) {}

void ProgressPrinter::message(std::string_view line) {
  if (out_ == nullptr) return;
  if (line_open_) std::fputs("\r\033[K", out_);
  std::fprintf(out_, "%.*s\n", static_cast<int>(line.size()), line.data());
  line_open_ = false;
  std::fflush(out_);
}

std::string ProgressPrinter::figures(const StepLog& log, double eta_s) const {
  const char* label = emulated_ ? " emulated" : "";
  // A pipeline's speedup against its ideal; one rank has none to show.
  const std::string ideal =
      log.busy_s.size() > 1 ? fmt::format("{} of ideal", format_percent(log.ideal_fraction)) : "";
  const std::string gap = ideal.empty() ? "" : " ";
  if (terminal_) {
    return fmt::format("loss {:.4f}  {}{}  bubble {} (pred {}){}{}  ETA {}", log.loss, tokens_rate(log.tokens_per_s),
                       label, format_percent(log.bubble_measured), format_percent(log.bubble_predicted), gap + gap,
                       ideal, format_eta(eta_s));
  }
  const std::string scale = log.loss_scale ? fmt::format(" loss_scale {:g}", *log.loss_scale) : "";
  return fmt::format("loss {:.4f} lr {:.3g} grad_norm {:.3g}{} {}{} step {}{} bubble {}{} (predicted {}){}{} ETA {}",
                     log.loss, log.lr, log.grad_norm, scale, tokens_rate(log.tokens_per_s), label,
                     format_seconds(log.step_time_s), label, format_percent(log.bubble_measured), label,
                     format_percent(log.bubble_predicted), gap, ideal, format_eta(eta_s));
}

void ProgressPrinter::step(const StepLog& log, double elapsed_s) {
  if (out_ == nullptr) return;
  const int done = static_cast<int>(log.step) + 1;
  const double eta = elapsed_s / std::max(1, done - first_) * (total_ - done);
  if (log.val_loss) message(fmt::format("after {}: validation loss {:.4f}", format_count(done, "step"), *log.val_loss));
  if (terminal_) {
    const int filled = kBarWidth * done / total_;
    const std::string bar = std::string(static_cast<std::size_t>(filled), '=') +
                            (filled < kBarWidth ? ">" : "") +
                            std::string(static_cast<std::size_t>(std::max(0, kBarWidth - filled - 1)), ' ');
    const int width = static_cast<int>(std::to_string(total_).size());
    std::fprintf(out_, "\r\033[Kstep %*d/%d [%s] %s", width, done, total_, bar.c_str(), figures(log, eta).c_str());
    line_open_ = true;
  } else if (done == first_ + 1 || done == total_ || done % every_ == 0 || log.val_loss) {
    std::fprintf(out_, "step %d/%d %s\n", done, total_, figures(log, eta).c_str());
  }
  std::fflush(out_);
}

void ProgressPrinter::finish() {
  if (out_ == nullptr) return;
  if (line_open_) std::fputs("\n", out_);
  line_open_ = false;
  std::fflush(out_);
}

}  // namespace pipeflow::runtime
