// Fuzzes the memprof trace reader (tools/memprof/memprof.h): read_trace on the input as a .memprof.jsonl
// file, then what `memprof summary` and `memprof html` do with it — replay, summarize, the text and JSON
// summaries and the HTML page.
//
// Input: the trace's text (JSON Lines: a strata.memprof header, then tensor / sample / event / gap / end
// lines).
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_util.h"
#include "tools/memprof/html.h"
#include "tools/memprof/memprof.h"

namespace {

using namespace strata::memprof;

constexpr std::string_view kTarget = "memprof_trace";

void run(const std::string& path) {
  Trace tr = read_trace(path);
  std::vector<TimelinePoint> tl = replay(tr);
  if (tl.empty()) strata::fuzz::fail(kTarget, "replay() returned no starting point");
  Summary s = summarize(tr, 3);
  (void)format_summary(s);
  (void)summary_json(s).dump();
  (void)render_html(tr, {.max_points = 64});
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string path = strata::fuzz::write_input("run.memprof.jsonl", data, size);
  strata::fuzz::expect_strata_errors(kTarget, [&] { run(path); });
  return 0;
}
