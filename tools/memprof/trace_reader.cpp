// Reading memprof traces: parse, replay, summarize.
#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <type_traits>

#include "core/error.h"
#include "core/log.h"
#include "tools/memprof/memprof.h"

namespace strata::memprof {

using nlohmann::json;
using strata::detail::cat;

// (tiering/snapshot.h; the value is named by the line in read_trace's error.)
template <typename T>
T whole_of(const json& v) {
  return tiering::json_whole<T>(v, "a number");
}

namespace {

TraceSample sample_from(const json& j) {
  TraceSample s;
  s.t_ns = whole_of<std::int64_t>(j.at("t"));
  s.step = whole_of<std::int64_t>(j.at("step"));
  s.phase = parse_phase(j.at("phase").get<std::string>(), "sample.phase");
  const json& b = j.at("bytes");
  for (int t = 0; t < kTierCount; ++t) {
    const json& row = b.at(to_string(Tier(t)));
    // A trace written before a kind existed has fewer columns: the missing kinds held nothing.
    for (int k = 0; k < kKindCount; ++k)
      s.bytes[t][k] = std::size_t(k) < row.size() ? whole_of<std::uint64_t>(row.at(k)) : 0;
  }
  for (int t = 0; t < kTierCount; ++t) s.reserved[t] = whole_of<std::uint64_t>(j.at("reserved").at(t));
  return s;
}

TraceTensor tensor_from(const json& j) {
  TraceTensor t;
  t.id = whole_of<TensorId>(j.at("id"));
  t.name = j.at("name").get<std::string>();
  t.kind = parse_kind(j.at("kind").get<std::string>(), "tensor.kind");
  t.dtype = parse_dtype(j.at("dtype").get<std::string>(), "tensor.dtype");
  t.bytes = whole_of<std::uint64_t>(j.at("bytes"));
  t.home = parse_tier(j.at("home").get<std::string>(), "tensor.home");
  t.chunk = whole_of<std::int32_t>(j.at("chunk"));
  t.shard = whole_of<std::int32_t>(j.at("shard"));
  return t;
}

void read_header(Trace& tr, const json& h) {
  if (!h.is_object() || h.value("schema", "") != kSchema || h.value("type", "") != "header")
    throw ConfigError(cat(tr.path, ":1: not a memprof trace (the first line must be the ", kSchema,
                          " header; was the file written with strata.memprof.path?)"));
  const std::int64_t version = h.contains("version") ? whole_of<std::int64_t>(h["version"]) : 0;
  if (version < 1 || version > kSchemaVersion)
    throw ConfigError(cat(tr.path, ":1: trace version ", version, " is not supported (this memprof reads 1..",
                          kSchemaVersion, "); use a newer memprof"));
  tr.header = h;
  tr.backend = h.value("backend", "");
  tr.device = h.value("device", "");
  tr.start_t = h.contains("start_t") ? whole_of<std::int64_t>(h["start_t"]) : 0;
  for (const json& t : h.at("tiers")) {
    int i = int(parse_tier(t.at("tier").get<std::string>(), "header.tiers[].tier"));
    tr.present[i] = t.at("present").get<bool>();
    tr.capacity[i] = whole_of<std::uint64_t>(t.at("capacity"));
  }
}

}  // namespace

Trace read_trace(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    throw IoError(cat("cannot read the memprof trace ", path, " (", strata::detail::errno_text(errno), ")"));
  Trace tr;
  tr.path = path;
  std::string line;
  std::size_t lineno = 0;
  std::vector<std::string> lines;
  while (std::getline(in, line)) lines.push_back(std::move(line));
  for (const std::string& l : lines) {
    ++lineno;
    if (l.empty()) continue;
    json j = json::parse(l, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded()) {
      if (lineno == lines.size() && lineno > 1) {
        STRATA_LOG_WARN("memprof: ", path, ":", lineno,
                        ": last line is cut short (the run was killed?); skipped");
        break;
      }
      throw ConfigError(cat(path, ":", lineno, ": not a JSON line"));
    }
    try {
      if (lineno == 1) {
        read_header(tr, j);
        continue;
      }
      std::string type = j.value("type", "");
      if (type == "event")
        tr.events.push_back(event_from_json(j));
      else if (type == "sample")
        tr.samples.push_back(sample_from(j));
      else if (type == "tensor")
        tr.tensors.push_back(tensor_from(j));
      else if (type == "gap")
        tr.dropped += whole_of<std::uint64_t>(j.at("dropped"));
      else if (type == "end") {
        tr.end_t = whole_of<std::int64_t>(j.at("t"));
        tr.writer_cpu_ns = j.contains("writer_cpu_ns") ? whole_of<std::int64_t>(j["writer_cpu_ns"]) : 0;
        tr.final_snapshot = Snapshot::from_json(j.at("snapshot"));
      }
      // Other types come from newer writers; a reader of this version skips them.
    } catch (const json::exception& e) {
      // (Not j.value("type", ...): that throws again when "type" is there but not a string, or j is no
      // object.)
      const bool named = j.is_object() && j.contains("type") && j["type"].is_string();
      throw ConfigError(cat(path, ":", lineno, ": malformed ", named ? j["type"].get<std::string>() : "line",
                            ": ", e.what()));
    } catch (const ConfigError& e) {
      throw ConfigError(cat(path, ":", lineno, ": ", e.what()));
    }
  }
  if (lineno == 0) throw ConfigError(cat(path, ": empty file, not a memprof trace"));
  std::sort(tr.events.begin(), tr.events.end(),
            [](const MemEvent& a, const MemEvent& b) { return a.seq < b.seq; });
  return tr;
}

std::vector<TimelinePoint> replay(const Trace& tr) {
  std::vector<TimelinePoint> out;
  TimelinePoint cur;
  if (!tr.samples.empty()) {
    cur.t_ns = tr.samples.front().t_ns;
    cur.step = tr.samples.front().step;
    cur.phase = tr.samples.front().phase;
    cur.bytes = tr.samples.front().bytes;
  } else {
    cur.t_ns = tr.start_t;
  }
  out.push_back(cur);
  std::vector<const MemEvent*> order;
  for (const MemEvent& e : tr.events)
    if (e.type == EventType::alloc || e.type == EventType::free || e.type == EventType::marker)
      order.push_back(&e);
  std::stable_sort(order.begin(), order.end(), [](const MemEvent* a, const MemEvent* b) {
    return a->t_ns != b->t_ns ? a->t_ns < b->t_ns : a->seq < b->seq;
  });
  for (const MemEvent* e : order) {
    cur.t_ns = std::max(cur.t_ns, e->t_ns);
    if (e->type == EventType::marker) {
      cur.step = e->step;
      cur.phase = e->phase;
    } else {
      std::uint64_t& b = cur.bytes[int(e->tier)][int(e->kind)];
      if (e->type == EventType::alloc)
        b += e->bytes;
      else
        b -= std::min(b, e->bytes);
    }
    out.push_back(cur);
  }
  return out;
}

Summary summarize(const Trace& tr, std::size_t top) {
  Summary s;
  s.path = tr.path;
  s.backend = tr.backend;
  s.device = tr.device;
  s.present = tr.present;
  s.capacity = tr.capacity;
  s.tensors = tr.tensors.size();
  s.events = tr.events.size();
  s.dropped = tr.dropped;
  s.writer_cpu_ns = tr.writer_cpu_ns;
  std::vector<TimelinePoint> tl = replay(tr);
  std::int64_t t_end = std::max(tl.back().t_ns, tr.end_t);
  if (!tr.samples.empty()) t_end = std::max(t_end, tr.samples.back().t_ns);
  s.duration_s = double(t_end - tr.start_t) * 1e-9;
  s.first_step = tl.front().step;
  s.last_step = tl.front().step;
  for (const TimelinePoint& p : tl) {
    s.first_step = std::min(s.first_step, p.step);
    s.last_step = std::max(s.last_step, p.step);
    for (int t = 0; t < kTierCount; ++t) {
      std::uint64_t sum = 0;
      for (int k = 0; k < kKindCount; ++k) {
        s.peak[t][k] = std::max(s.peak[t][k], p.bytes[t][k]);
        sum += p.bytes[t][k];
      }
      s.peak_total[t] = std::max(s.peak_total[t], sum);
    }
  }
  for (const MemEvent& e : tr.events) {
    switch (e.type) {
      case EventType::move_done: {
        MoveCounter& m = s.moves[direction(e.tier, e.to)];
        ++m.count;
        m.bytes += e.bytes;
        break;
      }
      case EventType::move_failed:
        ++s.failed_moves;
        break;
      case EventType::evict:
        ++s.evictions;
        s.evicted_bytes += e.bytes;
        break;
      case EventType::oom:
        ++s.ooms;
        s.oom_events.push_back(e);
        break;
      default:
        break;
    }
  }
  if (tr.dropped > 0 && tr.final_snapshot) {
    // Events are missing: the manager's own counters (end snapshot) are the exact figures.
    s.exact = false;
    const Snapshot& f = *tr.final_snapshot;
    for (int t = 0; t < kTierCount; ++t) {
      for (int k = 0; k < kKindCount; ++k) s.peak[t][k] = f.tiers[t].by_kind[k].peak;
      s.peak_total[t] = f.tiers[t].total.peak;
    }
    s.moves = f.moves;
    s.evictions = f.evictions;
    s.evicted_bytes = f.evicted_bytes;
    s.ooms = f.ooms;
    s.failed_moves = f.failed_moves;
  } else if (tr.dropped > 0) {
    s.exact = false;
  }
  s.largest = tr.tensors;
  std::stable_sort(s.largest.begin(), s.largest.end(),
                   [](const TraceTensor& a, const TraceTensor& b) { return a.bytes > b.bytes; });
  if (s.largest.size() > top) s.largest.resize(top);
  return s;
}

std::string format_summary(const Summary& s) {
  std::ostringstream os;
  char line[512];
  os << "memprof summary: " << s.path << "\n";
  std::snprintf(line, sizeof line,
                "backend %s (%s), %.3f s, steps %lld..%lld, %llu tensors, %llu events%s\n\n",
                s.backend.c_str(), s.device.c_str(), s.duration_s, (long long)s.first_step,
                (long long)s.last_step, (unsigned long long)s.tensors, (unsigned long long)s.events,
                s.exact ? "" : " (events were dropped: figures from the end snapshot)");
  os << line;
  os << "Peak bytes per tier and kind\n";
  std::snprintf(line, sizeof line, "  %-7s %12s", "tier", "capacity");
  os << line;
  for (int k = 0; k < kKindCount; ++k) {
    std::snprintf(line, sizeof line, " %12s", to_string(Kind(k)));
    os << line;
  }
  std::snprintf(line, sizeof line, " %12s\n", "tier peak");
  os << line;
  for (int t = 0; t < kTierCount; ++t) {
    std::string cap = !s.present[t] ? "absent" : s.capacity[t] ? format_size(s.capacity[t]) : "unlimited";
    std::snprintf(line, sizeof line, "  %-7s %12s", to_string(Tier(t)), cap.c_str());
    os << line;
    for (int k = 0; k < kKindCount; ++k) {
      std::snprintf(line, sizeof line, " %12s", format_size(s.peak[t][k]).c_str());
      os << line;
    }
    std::snprintf(line, sizeof line, " %12s\n", format_size(s.peak_total[t]).c_str());
    os << line;
  }
  os << "\nMoves\n";
  std::snprintf(line, sizeof line, "  %-18s %10s %14s\n", "direction", "count", "bytes");
  os << line;
  for (int d = 0; d < kDirectionCount; ++d) {
    std::snprintf(line, sizeof line, "  %-18s %10llu %14s\n", direction_name(d),
                  (unsigned long long)s.moves[d].count, format_size(s.moves[d].bytes).c_str());
    os << line;
  }
  std::snprintf(line, sizeof line, "\nEvictions %llu (%s), failed moves %llu, OOMs %llu\n",
                (unsigned long long)s.evictions, format_size(s.evicted_bytes).c_str(),
                (unsigned long long)s.failed_moves, (unsigned long long)s.ooms);
  os << line;
  for (const MemEvent& e : s.oom_events) {
    std::snprintf(line, sizeof line, "  OOM at %.3f s (step %lld, %s): %s on %s\n", double(e.t_ns) * 1e-9,
                  (long long)e.step, to_string(e.phase), format_size(e.bytes).c_str(), to_string(e.tier));
    os << line;
  }
  os << "\nLargest tensors\n";
  for (const TraceTensor& t : s.largest) {
    std::snprintf(line, sizeof line, "  %-40s %-10s %-5s %12s  home %s\n", t.name.c_str(), to_string(t.kind),
                  dtype_name(t.dtype), format_size(t.bytes).c_str(), to_string(t.home));
    os << line;
  }
  if (s.writer_cpu_ns > 0) {
    std::snprintf(line, sizeof line, "\nTrace writer CPU time %.3f s (%.2f%% of the traced time)\n",
                  double(s.writer_cpu_ns) * 1e-9,
                  s.duration_s > 0 ? 100.0 * double(s.writer_cpu_ns) * 1e-9 / s.duration_s : 0.0);
    os << line;
  }
  return os.str();
}

json summary_json(const Summary& s) {
  json tiers = json::object();
  for (int t = 0; t < kTierCount; ++t) {
    json kinds = json::object();
    for (int k = 0; k < kKindCount; ++k) kinds[to_string(Kind(k))] = s.peak[t][k];
    tiers[to_string(Tier(t))] = {{"present", s.present[t]},
                                 {"capacity", s.capacity[t]},
                                 {"peak", kinds},
                                 {"peak_total", s.peak_total[t]}};
  }
  json moves = json::object();
  for (int d = 0; d < kDirectionCount; ++d)
    moves[direction_name(d)] = {{"count", s.moves[d].count}, {"bytes", s.moves[d].bytes}};
  json largest = json::array();
  for (const TraceTensor& t : s.largest)
    largest.push_back(
        {{"name", t.name}, {"kind", to_string(t.kind)}, {"bytes", t.bytes}, {"home", to_string(t.home)}});
  return {{"schema", kSchema},
          {"version", kSchemaVersion},
          {"type", "summary"},
          {"path", s.path},
          {"backend", s.backend},
          {"duration_s", s.duration_s},
          {"first_step", s.first_step},
          {"last_step", s.last_step},
          {"exact", s.exact},
          {"tiers", tiers},
          {"moves", moves},
          {"evictions", s.evictions},
          {"evicted_bytes", s.evicted_bytes},
          {"ooms", s.ooms},
          {"failed_moves", s.failed_moves},
          {"tensors", s.tensors},
          {"events", s.events},
          {"dropped", s.dropped},
          {"writer_cpu_ns", s.writer_cpu_ns},
          {"largest", largest}};
}

}  // namespace strata::memprof
