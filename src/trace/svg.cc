#include "pipeflow/trace/svg.h"

#include <algorithm>
#include <cmath>
#include <set>

#include "pipeflow/core/error.h"
#include "pipeflow/core/text.h"
#include "pipeflow/core/units.h"

namespace pipeflow {
namespace {

constexpr double kLeft = 70;        // rank labels
constexpr double kRight = 90;       // idle share labels
constexpr double kSeparatedWidth = 3;  // boxes at least this wide get a white outline
constexpr double kTop = 48;         // title
constexpr double kRowHeight = 26;
constexpr double kRowGap = 8;
constexpr double kCommHeight = 5;   // send/recv bars at the bottom of a row
constexpr double kMinChart = 640;
constexpr double kMaxChart = 1800;
constexpr double kPixelsPerBox = 18;  // target width of the busiest rank's boxes
constexpr double kLegendTop = 46;       // below the axis line
constexpr double kLegendRowHeight = 18;

struct Rgb {
  int r, g, b;
};

struct LegendEntry {
  std::string label;
  std::string fill;
};

struct Point {
  double x = 0;
  double y = 0;
};

Rgb base_colour(EventCategory category) {
  switch (category) {
    case EventCategory::kForward: return {0x4e, 0x79, 0xa7};
    case EventCategory::kBackward: return {0x59, 0xa1, 0x4f};
    case EventCategory::kBackwardInput: return {0xf2, 0x8e, 0x2b};
    case EventCategory::kBackwardWeight: return {0xb0, 0x7a, 0xa1};
    case EventCategory::kSend:
    case EventCategory::kRecv: return {0x44, 0x44, 0x44};
    case EventCategory::kWait: return {0xe1, 0x57, 0x59};
    case EventCategory::kAllreduce: return {0x76, 0xb7, 0xb2};
    case EventCategory::kTensorParallel: return {0x1f, 0x5f, 0x5b};
    case EventCategory::kOptimizer: return {0xed, 0xc9, 0x48};
    case EventCategory::kOther: return {0x9c, 0x75, 0x5f};
  }
  return {0, 0, 0};
}

// The colour mixed with white by `amount` in [0, 1].
std::string hex(Rgb c, double amount = 0) {
  auto mix = [&](int v) { return static_cast<int>(std::lround(v + (255 - v) * amount)); };
  return fmt::format("#{:02x}{:02x}{:02x}", mix(c.r), mix(c.g), mix(c.b));
}


std::string number(double v) { return fmt::format("{:.2f}", v); }

// 1, 2 or 5 times a power of ten, about a tenth of the span.
double tick_step(double span) {
  const double raw = span / 10;
  const double magnitude = std::pow(10.0, std::floor(std::log10(raw)));
  for (double f : {1.0, 2.0, 5.0}) {
    if (f * magnitude >= raw) return f * magnitude;
  }
  return 10 * magnitude;
}

class SvgTimeline {
 public:
  explicit SvgTimeline(const Timeline& timeline) : t_(timeline), origin_(timeline.start_s()) {
    std::vector<int> per_rank(static_cast<std::size_t>(std::max(t_.num_ranks, 1)), 0);
    for (const TraceEvent& e : t_.events) {
      if (e.action) chunks_ = std::max(chunks_, chunk(e) + 1);
      if (is_compute(e.category) && static_cast<std::size_t>(e.rank.value()) < per_rank.size()) {
        ++per_rank[static_cast<std::size_t>(e.rank.value())];
      }
    }
    const int busiest = *std::max_element(per_rank.begin(), per_rank.end());
    chart_ = std::clamp(busiest * kPixelsPerBox, kMinChart, kMaxChart);
    const double span = t_.makespan_s();
    scale_ = span > 0 ? chart_ / span : 0;
  }

  std::string render() const {
    const BubbleStats bubble = bubble_stats(t_);
    const std::string title = fmt::format("{} — bubble {}", xml_escape(t_.title), format_percent(bubble.overall));
    const double axis_y = kTop + t_.num_ranks * (kRowHeight + kRowGap);
    // Bold 15px text: up to about 10 px per character.
    const double width = std::max(kLeft + chart_ + kRight, kLeft + 10.5 * static_cast<double>(title.size()) + 20);
    const std::vector<LegendEntry> entries = legend_entries();
    const std::vector<Point> places = place_legend(entries, width);
    const double height = axis_y + kLegendTop + places.back().y + kLegendRowHeight + 8;
    std::string out = fmt::format(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{}\" height=\"{}\" viewBox=\"0 0 {} {}\" "
        "font-family=\"sans-serif\" font-size=\"11\">\n",
        number(width), number(height), number(width), number(height));
    out += "<defs><pattern id=\"hatch\" width=\"5\" height=\"5\" patternUnits=\"userSpaceOnUse\" "
           "patternTransform=\"rotate(45)\"><rect width=\"5\" height=\"5\" fill=\"#f6d3d3\"/>"
           "<line x1=\"0\" y1=\"0\" x2=\"0\" y2=\"5\" stroke=\"" + hex(base_colour(EventCategory::kWait)) +
           "\" stroke-width=\"2\"/></pattern></defs>\n";
    out += "<rect width=\"100%\" height=\"100%\" fill=\"#ffffff\"/>\n";
    out += fmt::format("<text x=\"{}\" y=\"24\" font-size=\"15\" font-weight=\"bold\">{}</text>\n", number(kLeft),
                       title);
    for (int r = 0; r < t_.num_ranks; ++r) out += row(r, bubble.per_rank[static_cast<std::size_t>(r)]);
    out += axis(axis_y);
    out += legend(entries, places, axis_y + kLegendTop);
    return out + "</svg>\n";
  }

 private:
  int chunk(const TraceEvent& e) const { return e.action->stage.value() / std::max(t_.num_ranks, 1); }
  double x(double time_s) const { return kLeft + (time_s - origin_) * scale_; }
  double row_y(int r) const { return kTop + r * (kRowHeight + kRowGap); }

  std::string fill(const TraceEvent& e) const {
    if (e.category == EventCategory::kWait) return "url(#hatch)";
    const double lighter = (e.action && chunks_ > 1) ? 0.55 * chunk(e) / (chunks_ - 1) : 0.0;
    return hex(base_colour(e.category), lighter);
  }

  std::string box(const TraceEvent& e, double y) const {
    const double width = e.duration_s * scale_;
    const bool comm = e.category == EventCategory::kSend || e.category == EventCategory::kRecv;
    if (width <= 0) return "";
    const double top = comm ? y + kRowHeight - kCommHeight : y + 1;
    const double height = comm ? kCommHeight : kRowHeight - 2;
    std::string out = fmt::format("<rect class=\"{}\"", to_string(e.category));
    if (is_compute(e.category) && e.action) out += fmt::format(" data-action=\"{}\"", xml_escape(e.name));
    // The white separator is 1.2 px of every box: on narrower boxes (a long
    // step, thousands of actions per row) it would wash the colours out.
    const char* separator = width >= kSeparatedWidth ? " stroke=\"#ffffff\" stroke-width=\"0.6\"" : "";
    out += fmt::format(" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"{}\"{}><title>{} {} {:g}+{:g}</title>"
                       "</rect>\n",
                       number(x(e.start_s)), number(top), number(width), number(height), fill(e), separator,
                       xml_escape(e.name), to_string(e.category), e.start_s - origin_, e.duration_s);
    const std::string label = e.action ? std::to_string(e.action->microbatch.value()) : std::string();
    if (is_compute(e.category) && !label.empty() && width >= 7.0 * static_cast<double>(label.size()) + 4) {
      const bool light = e.action && chunks_ > 1 && chunk(e) > 0;
      out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\" fill=\"{}\">{}</text>\n",
                         number(x(e.start_s) + width / 2), number(y + kRowHeight / 2 + 4), light ? "#222222" : "#ffffff",
                         label);
    }
    return out;
  }

  std::string row(int r, double idle) const {
    const double y = row_y(r);
    std::string out = fmt::format("<g class=\"rank\" data-rank=\"{}\">\n", r);
    out += fmt::format("<text x=\"8\" y=\"{}\">rank {}</text>\n", number(y + kRowHeight / 2 + 4), r);
    out += fmt::format("<rect class=\"idle\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" fill=\"#eeeeee\"/>\n",
                       number(kLeft), number(y), number(chart_), number(kRowHeight));
    for (const TraceEvent& e : t_.events) {
      if (e.rank.value() == r) out += box(e, y);
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\">idle {}</text>\n", number(kLeft + chart_ + 8),
                       number(y + kRowHeight / 2 + 4), format_percent(idle));
    return out + "</g>\n";
  }

  std::string axis(double y) const {
    std::string out = "<g class=\"axis\">\n";
    out += fmt::format("<line x1=\"{}\" y1=\"{}\" x2=\"{}\" y2=\"{}\" stroke=\"#333333\"/>\n", number(kLeft),
                       number(y), number(kLeft + chart_), number(y));
    const double span = t_.makespan_s();
    if (span > 0) {
      const double step = tick_step(span);
      for (int i = 0; i * step <= span * (1 + 1e-9); ++i) {
        const double px = kLeft + i * step * scale_;
        out += fmt::format("<line x1=\"{0}\" y1=\"{1}\" x2=\"{0}\" y2=\"{2}\" stroke=\"#333333\"/>\n", number(px),
                           number(y), number(y + 4));
        out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"middle\">{:g}</text>\n", number(px),
                           number(y + 16), i * step);
      }
    }
    out += fmt::format("<text x=\"{}\" y=\"{}\" text-anchor=\"end\">time ({})</text>\n", number(kLeft + chart_),
                       number(y + 30), xml_escape(t_.time_unit));
    return out + "</g>\n";
  }

  // What the legend explains: the categories present, the lighter later
  // chunks, idle.
  std::vector<LegendEntry> legend_entries() const {
    std::set<EventCategory> present;
    for (const TraceEvent& e : t_.events) {
      if (e.duration_s > 0) present.insert(e.category);
    }
    std::vector<LegendEntry> entries;
    const std::pair<EventCategory, const char*> kinds[] = {
        {EventCategory::kForward, "F forward"},          {EventCategory::kBackward, "B backward"},
        {EventCategory::kBackwardInput, "I input grad"}, {EventCategory::kBackwardWeight, "W weight grad"},
        {EventCategory::kSend, "send/recv"},             {EventCategory::kWait, "wait"},
        {EventCategory::kAllreduce, "all-reduce"},       {EventCategory::kTensorParallel, "tensor-parallel all-reduce"},
        {EventCategory::kOptimizer, "optimizer"},
        {EventCategory::kOther, "other"}};
    for (const auto& [category, label] : kinds) {
      const bool shown = present.count(category) || (category == EventCategory::kSend && present.count(EventCategory::kRecv));
      if (shown) entries.push_back({label, category == EventCategory::kWait ? "url(#hatch)" : hex(base_colour(category))});
    }
    if (chunks_ > 1) entries.push_back({"later chunk (lighter)", hex(base_colour(EventCategory::kForward), 0.55)});
    entries.push_back({"idle", "#eeeeee"});
    return entries;
  }

  // Where each entry's swatch goes, relative to the legend's top left: rows
  // filled from the left, wrapped before an entry would pass `width` (swatch,
  // gap, label at about 6.5 px per character of 11px text, spacing).
  static std::vector<Point> place_legend(const std::vector<LegendEntry>& entries, double width) {
    std::vector<Point> places;
    Point at{0, 0};
    for (const LegendEntry& entry : entries) {
      const double entry_width = 24 + 6.5 * static_cast<double>(entry.label.size());
      if (at.x > 0 && kLeft + at.x + entry_width > width) at = {0, at.y + kLegendRowHeight};
      places.push_back(at);
      at.x += entry_width;
    }
    return places;
  }

  static std::string legend(const std::vector<LegendEntry>& entries, const std::vector<Point>& places, double y) {
    std::string out = "<g class=\"legend\">\n";
    for (std::size_t i = 0; i < entries.size(); ++i) {
      const double left = kLeft + places[i].x;
      const double top = y + places[i].y;
      out += fmt::format("<rect x=\"{}\" y=\"{}\" width=\"12\" height=\"12\" fill=\"{}\" stroke=\"#999999\"/>\n",
                         number(left), number(top), entries[i].fill);
      out += fmt::format("<text x=\"{}\" y=\"{}\">{}</text>\n", number(left + 16), number(top + 10),
                         xml_escape(entries[i].label));
    }
    return out + "</g>\n";
  }

  const Timeline& t_;
  const double origin_;
  int chunks_ = 1;
  double chart_ = kMinChart;
  double scale_ = 0;
};

}  // namespace

void check_svg_events(std::size_t events, std::string_view fix) {
  if (events > kMaxSvgEvents) {
    fail("an SVG timeline of {} events is more than the limit of {} (about 60 MB, more than a browser draws): {}",
         events, kMaxSvgEvents, fix);
  }
}

std::string render_svg(const Timeline& timeline) {
  check_svg_events(timeline.events.size(), "use fewer stages or micro-batches, or a Chrome trace");
  return SvgTimeline(timeline).render();
}

std::string xml_escape(std::string_view text) {
  std::string out;
  for (std::size_t i = 0; i < text.size();) {
    const std::size_t length = utf8_sequence_length(text, i);
    const std::string_view character = text.substr(i, std::max<std::size_t>(length, 1));
    i += character.size();
    // XML 1.0 holds no other control character, no U+FFFE or U+FFFF and no
    // byte outside UTF-8, written as it is or as a reference (&#1; is
    // ill-formed too): each such byte becomes U+FFFD, the replacement character.
    const auto byte = static_cast<unsigned char>(character.front());
    if (length == 0 || (byte < 0x20 && byte != '\t' && byte != '\n' && byte != '\r') || character == "\xEF\xBF\xBE" ||
        character == "\xEF\xBF\xBF") {
      out += "\xEF\xBF\xBD";
      continue;
    }
    switch (byte) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      default: out += character;
    }
  }
  return out;
}

}  // namespace pipeflow
