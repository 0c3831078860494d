#include "tiering/trace_writer.h"

#include <cerrno>
#include <charconv>
#include <chrono>
#include <cinttypes>
#include <cstring>
#include <ctime>
#include <string_view>

#include "core/error.h"
#include "core/log.h"

namespace strata::tiering {
namespace {

std::int64_t thread_cpu_ns() {
  timespec ts{};
  ::clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return std::int64_t(ts.tv_sec) * 1'000'000'000 + ts.tv_nsec;
}

// Samples are written when the figures change, and at least this often while the run is idle.
constexpr std::int64_t kIdleSampleNs = 1'000'000'000;

// Builds one line without the cost of printf's format parsing (an event line is most of the writer's
// work on a busy run).
class Line {
 public:
  Line& raw(std::string_view s) {
    std::memcpy(p_, s.data(), s.size());
    p_ += s.size();
    return *this;
  }
  template <typename Int>
  Line& num(Int v) {
    p_ = std::to_chars(p_, buf_ + sizeof buf_, v).ptr;
    return *this;
  }
  Line& quoted(const char* s) { return raw("\"").raw(s).raw("\""); }
  const char* data() const { return buf_; }
  std::size_t size() const { return std::size_t(p_ - buf_); }

 private:
  char buf_[768];  // the longest line (a sample) is under 500 bytes
  char* p_ = buf_;
};

}  // namespace

TraceWriter::TraceWriter(TierManager& m, TraceOptions opts) : m_(m), opts_(std::move(opts)) {
  if (opts_.path.empty()) throw ConfigError("strata.memprof.path: empty; give the trace file to write");
  if (opts_.sample_interval_ms < 1)
    throw ConfigError(strata::detail::cat("strata.memprof.sample_interval_ms: ", opts_.sample_interval_ms,
                                          " is not allowed; use 1 or more milliseconds"));
  f_ = std::fopen(opts_.path.c_str(), "w");
  if (!f_)
    throw IoError(strata::detail::cat("cannot open the memprof trace ", opts_.path, " for writing (",
                                      strata::detail::errno_text(errno), "); check strata.memprof.path"));
  buf_.resize(1 << 20);
  std::setvbuf(f_, buf_.data(), _IOFBF, buf_.size());

  Usage u = m_.usage();
  const DeviceCaps& caps = m_.device().caps();
  nlohmann::json tiers = nlohmann::json::array();
  for (int t = 0; t < kTierCount; ++t)
    tiers.push_back({{"tier", to_string(Tier(t))}, {"present", u.present[t]}, {"capacity", u.capacity[t]}});
  nlohmann::json kinds = nlohmann::json::array();
  for (int k = 0; k < kKindCount; ++k) kinds.push_back(to_string(Kind(k)));
  auto unix_ms = std::chrono::duration_cast<std::chrono::milliseconds>(
                     std::chrono::system_clock::now().time_since_epoch())
                     .count();
  nlohmann::json header = {{"schema", kSchema},     {"version", kSchemaVersion},
                           {"type", "header"},      {"start_unix_ms", unix_ms},
                           {"start_t", u.t_ns},     {"backend", to_string(caps.backend)},
                           {"device", caps.name},   {"sample_interval_ms", opts_.sample_interval_ms},
                           {"tiers", tiers},        {"kinds", kinds},
                           {"config", opts_.config}};
  std::string line = header.dump() + "\n";
  put(line.data(), line.size());
  {
    std::lock_guard<std::mutex> lk(drain_mu_);
    // Tensors registered before the trace began, then the figures they already hold.
    for (TensorId id : m_.tensor_ids()) write_tensor(id);
    last_seq_ = u.last_seq;
    write_sample(u);
  }
  std::fflush(f_);
  thread_ = std::thread([this] { loop(); });
}

TraceWriter::~TraceWriter() {
  try {
    close();
  } catch (const std::exception& e) {
    STRATA_LOG_ERROR("memprof trace ", opts_.path, ": ", e.what());
  }
}

void TraceWriter::put(const char* s, std::size_t n) {
  if (std::fwrite(s, 1, n, f_) != n) io_error_ = true;
  stats_.bytes += n;
}

void TraceWriter::write_tensor(TensorId id) {
  if (!described_.insert(id).second) return;
  std::optional<TensorDesc> d = m_.describe(id);
  if (!d) return;
  nlohmann::json j = {{"type", "tensor"},
                      {"id", id},
                      {"name", d->name},
                      {"kind", to_string(d->kind)},
                      {"dtype", dtype_name(d->dtype)},
                      {"bytes", d->bytes},
                      {"home", to_string(d->home)},
                      {"chunk", d->chunk},
                      {"shard", d->shard}};
  std::string line = j.dump() + "\n";
  put(line.data(), line.size());
}

void TraceWriter::write_sample(const Usage& u) {
  Line l;
  l.raw("{\"type\":\"sample\",\"t\":").num(u.t_ns).raw(",\"step\":").num(u.step).raw(",\"phase\":");
  l.quoted(to_string(u.phase)).raw(",\"bytes\":{");
  for (int t = 0; t < kTierCount; ++t) {
    l.raw(t ? "," : "").quoted(to_string(Tier(t))).raw(":[");
    for (int k = 0; k < kKindCount; ++k) l.raw(k ? "," : "").num(u.bytes[t][k]);
    l.raw("]");
  }
  l.raw("},\"reserved\":[")
      .num(u.reserved[0])
      .raw(",")
      .num(u.reserved[1])
      .raw(",")
      .num(u.reserved[2])
      .raw("]}\n");
  put(l.data(), l.size());
  ++stats_.samples;
  last_sample_ = u;
  have_sample_ = true;
}

void TraceWriter::drain(bool force_sample) {
  std::int64_t c0 = thread_cpu_ns();
  std::uint64_t dropped = 0;
  std::vector<MemEvent> evs = m_.events_since(last_seq_, &dropped);
  if (dropped) {
    char line[128];
    int n = std::snprintf(line, sizeof line,
                          "{\"type\":\"gap\",\"after_seq\":%" PRIu64 ",\"dropped\":%" PRIu64 "}\n", last_seq_,
                          dropped);
    put(line, std::size_t(n));
    stats_.dropped += dropped;
    STRATA_WARN_ONCE("memprof trace ", opts_.path, ": ", dropped,
                     " events were overwritten in the ring before the writer read them; lower "
                     "strata.memprof.sample_interval_ms or enlarge the event ring");
  }
  for (const MemEvent& e : evs) {
    if (e.type == EventType::tensor_added) write_tensor(e.tensor);
    Line l;
    l.raw("{\"type\":\"event\",\"seq\":").num(e.seq).raw(",\"t\":").num(e.t_ns);
    l.raw(",\"ev\":").quoted(to_string(e.type)).raw(",\"tier\":").quoted(to_string(e.tier));
    l.raw(",\"to\":").quoted(to_string(e.to)).raw(",\"kind\":").quoted(to_string(e.kind));
    l.raw(",\"phase\":").quoted(to_string(e.phase)).raw(",\"tensor\":").num(e.tensor);
    l.raw(",\"bytes\":").num(e.bytes).raw(",\"step\":").num(e.step).raw("}\n");
    put(l.data(), l.size());
    last_seq_ = e.seq;
  }
  stats_.events += evs.size();
  Usage u = m_.usage();
  bool changed = !have_sample_ || u.bytes != last_sample_.bytes || u.reserved != last_sample_.reserved ||
                 u.step != last_sample_.step || u.phase != last_sample_.phase;
  if (force_sample || changed || u.t_ns - last_sample_.t_ns >= kIdleSampleNs) write_sample(u);
  std::fflush(f_);
  cpu_ns_ += thread_cpu_ns() - c0;
}

// Reading the manager's figures queries the device's events (the pools' fences), so the thread binds the
// device first (Note [thread device] in core/device.h). An error on this thread (the device refused, say)
// ends the sampling with one log line instead of the process; close() still drains and writes the end
// from its caller's thread.
void TraceWriter::loop() {
  try {
    m_.device().bind_thread();
    std::unique_lock<std::mutex> lk(m_stop_);
    while (!stop_) {
      cv_.wait_for(lk, std::chrono::milliseconds(opts_.sample_interval_ms), [&] { return stop_; });
      if (stop_) break;
      lk.unlock();
      {
        std::lock_guard<std::mutex> dl(drain_mu_);
        drain(false);
      }
      lk.lock();
    }
  } catch (const std::exception& e) {
    STRATA_LOG_ERROR("memprof trace ", opts_.path, ": the writer thread stopped sampling: ", e.what(),
                     "; the trace's last sample is written at close");
  }
}

void TraceWriter::flush() {
  std::lock_guard<std::mutex> dl(drain_mu_);
  if (f_) drain(false);
}

void TraceWriter::close() {
  {
    std::lock_guard<std::mutex> lk(m_stop_);
    if (closed_) return;
    closed_ = stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  std::lock_guard<std::mutex> dl(drain_mu_);
  drain(true);
  stats_.writer_cpu_ns = cpu_ns_.load();
  nlohmann::json end = {{"type", "end"},
                        {"t", last_sample_.t_ns},
                        {"events_written", stats_.events},
                        {"events_dropped", stats_.dropped},
                        {"samples", stats_.samples},
                        {"writer_cpu_ns", stats_.writer_cpu_ns},
                        {"snapshot", m_.snapshot(false).to_json()}};
  std::string line = end.dump() + "\n";
  put(line.data(), line.size());
  bool failed = io_error_ || std::ferror(f_);
  if (std::fclose(f_) != 0) failed = true;
  f_ = nullptr;
  if (failed)
    throw IoError(strata::detail::cat("writing the memprof trace ", opts_.path,
                                      " failed (disk full or removed?); the trace is incomplete"));
}

TraceStats TraceWriter::stats() const {
  std::lock_guard<std::mutex> dl(drain_mu_);
  TraceStats s = stats_;
  s.writer_cpu_ns = cpu_ns_.load();
  return s;
}

}  // namespace strata::tiering
