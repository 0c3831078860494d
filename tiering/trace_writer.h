// strata/tiering/trace_writer.h: the memprof trace — the event stream and periodic samples of a tier
// manager, written to a file while the run goes on (strata.memprof.path).
//
// Example:
//   strata::tiering::TraceWriter trace(manager, {.path = cfg.strata.memprof.path,
//                                                .sample_interval_ms = cfg.strata.memprof.sample_interval_ms,
//                                                .config = cfg.to_json()});
//   ... train ...
//   trace.close();            // or let the destructor do it; `memprof summary PATH` reads the file
//
// Format (JSON Lines, one object per line; docs/memprof.md has every field):
//   {"schema":"strata.memprof","version":1,"type":"header", tiers (capacity), kinds, config, ...}
//   {"type":"tensor", id, name, kind, dtype, bytes, home, chunk, shard}   before the tensor's first event
//   {"type":"sample", t, step, phase, bytes {tier: [per kind]}, reserved [per tier]}
//   {"type":"event", seq, t, ev, tier, to, kind, phase, tensor, bytes, step}
//   {"type":"gap", after_seq, dropped}                                    ring overflow between drains
//   {"type":"end", t, events_written, events_dropped, samples, writer_cpu_ns, snapshot {...}}
// Times are nanoseconds on the manager's steady clock.
//
// Cost: a background thread wakes every sample_interval_ms, copies the new events out of the manager's
// ring (one short lock), formats them and writes them through a 1 MiB stdio buffer. The manager's own
// work per event is one ring slot store, with or without a writer.
//
// Locking: close() and flush() may be called from any thread; they serialise with the background thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <unordered_set>

#include "tiering/manager.h"

namespace strata::tiering {

struct TraceOptions {
  std::string path;                                  // strata.memprof.path; required
  std::int64_t sample_interval_ms = 10;              // strata.memprof.sample_interval_ms; >= 1
  nlohmann::json config = nlohmann::json::object();  // the run's configuration, copied into the header
};

struct TraceStats {
  std::uint64_t events = 0;        // event lines written
  std::uint64_t dropped = 0;       // events overwritten in the ring before the writer read them
  std::uint64_t samples = 0;       // sample lines written
  std::uint64_t bytes = 0;         // bytes written to the file
  std::int64_t writer_cpu_ns = 0;  // CPU time the writer spent (its thread and flush() calls)
};

class TraceWriter {
 public:
  // Opens (truncates) opts.path and writes the header; IoError naming the path when it cannot. `m` must
  // outlive the writer.
  TraceWriter(TierManager& m, TraceOptions opts);
  ~TraceWriter();  // close(), logging instead of throwing
  TraceWriter(const TraceWriter&) = delete;
  TraceWriter& operator=(const TraceWriter&) = delete;

  // Writes what is new now (events and a sample), from the calling thread.
  void flush();
  // Stops the thread, writes the rest and the end line with a final snapshot, closes the file. IoError
  // when a write failed. Idempotent.
  void close();
  TraceStats stats() const;
  const std::string& path() const { return opts_.path; }

 private:
  void loop();
  void drain(bool force_sample);  // drain_mu_ held
  void write_tensor(TensorId id);
  void write_sample(const Usage& u);
  void put(const char* s, std::size_t n);

  TierManager& m_;
  TraceOptions opts_;
  std::FILE* f_ = nullptr;
  std::string buf_;  // the stdio buffer
  bool io_error_ = false;

  mutable std::mutex drain_mu_;  // one drain at a time; guards everything below it
  std::uint64_t last_seq_ = 0;
  std::unordered_set<TensorId> described_;
  Usage last_sample_;
  bool have_sample_ = false;
  TraceStats stats_;
  std::atomic<std::int64_t> cpu_ns_{0};

  std::mutex m_stop_;
  std::condition_variable cv_;
  bool stop_ = false, closed_ = false;
  std::thread thread_;
};

}  // namespace strata::tiering
