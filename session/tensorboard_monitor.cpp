#include "session/tensorboard_monitor.h"

#include <unistd.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>

#include "core/error.h"
#include "session/csv_monitor.h"

namespace strata::session {

// Note [Event files]
// ~~~~~~~~~~~~~~~~~~
// What TensorBoard reads (tensorboard's event_file_loader over TFRecords): a file of records, each
//   uint64 length, uint32 masked CRC-32C of those 8 bytes, `length` bytes of data, uint32 masked CRC of the
//   data (little-endian; masked = ((crc >> 15) | (crc << 17)) + 0xa282ead8),
// whose data is a serialised tensorflow.Event protocol buffer. The fields used, with their numbers and wire
// types: Event { double wall_time = 1 (64-bit); int64 step = 2 (varint); string file_version = 3;
// Summary summary = 5 }, Summary { repeated Value value = 1 }, Value { string tag = 1; float simple_value
// = 2 (32-bit) }. The first record of a file carries file_version "brain.Event:2"; TensorBoard's scalar
// dashboard shows a Value with simple_value under its tag. The encoding is written here by hand (a few
// dozen bytes a record): a protobuf library for three messages would be a dependency for nothing.
namespace {

using strata::detail::cat;
using strata::detail::errno_text;

// Protocol buffer wire encoding.
void put_varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(char((v & 0x7f) | 0x80));
    v >>= 7;
  }
  out.push_back(char(v));
}
void put_tag(std::string& out, int field, int wire_type) {
  put_varint(out, std::uint64_t(field << 3 | wire_type));
}
template <typename T>
void put_fixed(std::string& out, T v) {  // little-endian, as x86-64 and every Linux target Strata runs on
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}
void put_bytes(std::string& out, int field, std::string_view bytes) {
  put_tag(out, field, 2);
  put_varint(out, bytes.size());
  out.append(bytes);
}

constexpr int kFixed64 = 1, kVarint = 0, kFixed32 = 5;

// An Event with its wall time and step; `rest` is its other fields, already encoded.
std::string event(std::int64_t step, std::string_view rest) {
  const double now =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  std::string e;
  put_tag(e, 1, kFixed64);
  put_fixed(e, now);
  put_tag(e, 2, kVarint);
  put_varint(e, std::uint64_t(step));  // two's complement for a negative step, as protobuf's int64
  e.append(rest);
  return e;
}

std::span<const unsigned char> bytes_of(std::string_view s) {
  return {reinterpret_cast<const unsigned char*>(s.data()), s.size()};
}

std::string host_name() {
  char name[256] = {};
  if (::gethostname(name, sizeof name - 1) != 0 || !name[0]) return "localhost";
  return name;
}

}  // namespace

std::uint32_t crc32c(std::span<const unsigned char> bytes) {
  static const std::array<std::uint32_t, 256> table = [] {
    std::array<std::uint32_t, 256> t{};
    for (std::uint32_t i = 0; i < 256; ++i) {
      std::uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = c & 1 ? (c >> 1) ^ 0x82F63B78u : c >> 1;  // Castagnoli, reflected
      t[i] = c;
    }
    return t;
  }();
  std::uint32_t c = 0xFFFFFFFFu;
  for (unsigned char b : bytes) c = table[(c ^ b) & 0xff] ^ (c >> 8);
  return c ^ 0xFFFFFFFFu;
}

std::uint32_t masked_crc32c(std::span<const unsigned char> bytes) {
  const std::uint32_t c = crc32c(bytes);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string TensorBoardMonitor::directory(const TensorBoardConfig& c) {
  return monitor_directory(c.output_path, c.job_name);
}

TensorBoardMonitor::TensorBoardMonitor(const std::string& dir) {
  const auto secs =
      std::chrono::duration_cast<std::chrono::seconds>(std::chrono::system_clock::now().time_since_epoch())
          .count();
  char stamp[32];
  std::snprintf(stamp, sizeof stamp, "%010lld", static_cast<long long>(secs));
  // The last part counts this process's event files from 0, as TensorBoard's EventFileWriter does: a Python
  // process may open several runs' files in one second (a new engine, a load_checkpoint), and none may
  // truncate another's. A name some other writer holds already is skipped ("x": never overwrite).
  static std::atomic<unsigned> next{0};
  const std::string prefix = cat(dir, "/events.out.tfevents.", stamp, ".", host_name(), ".", ::getpid(), ".");
  do {
    path_ = cat(prefix, next.fetch_add(1));
    file_.reset(std::fopen(path_.c_str(), "wbx"));
  } while (!file_ && errno == EEXIST);
  if (!file_) throw IoError(cat("tensorboard: cannot create ", path_, ": ", errno_text(errno)));
  std::string version;
  put_bytes(version, 3, "brain.Event:2");
  record(event(0, version));
  flush();
}

void TensorBoardMonitor::write(std::string_view name, std::int64_t step, double value) {
  std::string v;
  put_bytes(v, 1, name);
  put_tag(v, 2, kFixed32);
  put_fixed(v, float(value));
  std::string summary;
  put_bytes(summary, 1, v);
  std::string rest;
  put_bytes(rest, 5, summary);
  record(event(step, rest));
}

void TensorBoardMonitor::record(const std::string& data) {
  std::string len;
  put_fixed(len, std::uint64_t(data.size()));
  pending_ += len;
  put_fixed(pending_, masked_crc32c(bytes_of(len)));
  pending_ += data;
  put_fixed(pending_, masked_crc32c(bytes_of(data)));
}

void TensorBoardMonitor::flush() {
  if (!pending_.empty() && std::fwrite(pending_.data(), 1, pending_.size(), file_.get()) != pending_.size())
    throw IoError(cat("tensorboard: cannot write ", path_, ": ", errno_text(errno)));
  pending_.clear();
  if (std::fflush(file_.get()) != 0)
    throw IoError(cat("tensorboard: cannot write ", path_, ": ", errno_text(errno)));
}

}  // namespace strata::session
