// memprof html: one self-contained page (inline CSS and JavaScript, no network) showing a trace as a
// stacked timeline of bytes per tier and kind, with step and phase markers and a hover readout.
#pragma once

#include <cstddef>
#include <string>

#include "tools/memprof/memprof.h"

namespace strata::memprof {

struct HtmlOptions {
  std::size_t max_points = 4000;  // timeline points per tier; buckets keep each bucket's highest total
  std::string title;              // default: the trace's file name
};

std::string render_html(const Trace& tr, const HtmlOptions& opts = {});

}  // namespace strata::memprof
