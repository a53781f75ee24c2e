#pragma once

#include <string>
#include <string_view>

#include "pipeflow/trace/event.h"

namespace pipeflow {

// A standalone SVG timeline of one step: a row per rank (labelled, with its
// idle share at the right), one box per compute event coloured by kind (F
// blue, B green, I orange, W purple), the micro-batch number inside when it
// fits, later model chunks of a rank in lighter shades of the same hue;
// send/recv as thin dark bars at the bottom of the row, waits hatched, idle
// time as the light-grey row background; a time axis, a legend, and the
// title with the overall bubble (bubble_stats). Every rank row is a
// <g class="rank" data-rank="r"> and every compute box a <rect> with a
// data-action attribute, so tools and tests can find them.
//
// Throws Error past kMaxSvgEvents events (about 60 MB of SVG, more than a
// browser draws), naming the fix.
inline constexpr std::size_t kMaxSvgEvents = 200'000;
std::string render_svg(const Timeline& timeline);

// Throws the Error render_svg would for a timeline of `events` events, with
// `fix` (what the caller can lower), so a caller can refuse before building
// the timeline.
void check_svg_events(std::size_t events, std::string_view fix);

// `text` with &, <, > and " written as entities, for XML and HTML text and
// attribute values, and well-formed XML whatever its bytes: a control
// character other than tab, line feed and carriage return, U+FFFE, U+FFFF
// and each byte that is not UTF-8 become U+FFFD (a schedule's name, a
// trace's title and event names are a user's bytes).
std::string xml_escape(std::string_view text);

}  // namespace pipeflow
