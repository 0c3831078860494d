// DeepSpeed's csv_monitor file layout (session/csv_monitor.h).
#include "session/csv_monitor.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <filesystem>
#include <system_error>

#include "core/error.h"
#include "core/log.h"

namespace strata::session {

// Note [Earlier runs' files]
// DeepSpeed's CSV monitor opens its files in append mode, so running a job again, or resuming it from a
// checkpoint older than its last step, leaves series whose step column goes back (4..40 then 24..40) and
// a plot that draws both runs over each other. Strata makes the folder describe the run that writes it:
//   - A new run (not resumed: no --load, no engine.load_checkpoint) replaces the files an earlier run
//     left: they are removed, with a warning naming them and saying how to keep them, and the run's first
//     write of each event starts a new file with its header. Removing rather than emptying also drops the
//     series this run will not write (eval loss without --eval-data, loss scale under bf16).
//   - A run resumed from a checkpoint whose step column reads S keeps each file's header line and its rows
//     with step <= S, byte for byte, and appends after them, so every series continues without going back.
//     A row is a complete line `<integer>,...`; anything else after the header (a torn last line of a
//     killed run, the repeated header DeepSpeed writes per run) is dropped. When a file already goes back
//     (written before this rule, or by DeepSpeed), a later row supersedes the earlier rows with a step at
//     or past its own — the later run resumed from that point — so the kept rows increase too.
//     A file that changes is rewritten to FILE.tmp, synced and renamed over FILE: a crash at any point
//     leaves either the old file or the trimmed one, never fewer rows than are kept.
// The constructor does this for every DIR/Train_Samples_*.csv (kEventPrefix: all the front-ends write),
// before the first step; a file of another event name is handled at its first write. Other files in the
// folder are never touched. Missing files are simply created, with their header, at the first write.

namespace {

using detail::cat;

// An event name as a file name: '/' and ' ' as '_'.
std::string file_stem(std::string_view name) {
  std::string file(name);
  for (char& ch : file)
    if (ch == '/' || ch == ' ') ch = '_';
  return file;
}

std::string base_name(const std::string& path) {
  return std::filesystem::path(path).filename().string();
}

std::string join_names(const std::vector<std::string>& paths) {
  std::string s;
  for (const std::string& p : paths) s += (s.empty() ? "" : ", ") + base_name(p);
  return s;
}

std::string read_all(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  STRATA_SYS_CHECK(f != nullptr, "csv_monitor: open ", path, " for reading");
  std::string text;
  char buf[1 << 16];
  std::size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) text.append(buf, n);
  const bool failed = std::ferror(f) != 0;
  const int err = errno;
  std::fclose(f);
  errno = err;
  STRATA_SYS_CHECK(!failed, "csv_monitor: read ", path);
  return text;
}

// `text` with its header line and the rows to keep at a resume from step `last` (Note [Earlier runs'
// files]); `dropped` counts the lines left out.
std::string kept_rows(std::string_view text, std::int64_t last, std::size_t& dropped) {
  dropped = 0;
  const std::size_t header_end = text.find('\n');
  if (header_end == std::string_view::npos) {  // a torn header: start the file again
    dropped = text.empty() ? 0 : 1;
    return {};
  }
  struct Row {
    std::string_view line;  // with its '\n'
    std::int64_t step;
  };
  std::vector<Row> rows;
  std::size_t lines = 0;
  for (std::size_t at = header_end + 1; at < text.size();) {
    const std::size_t end = text.find('\n', at);
    ++lines;
    if (end == std::string_view::npos) break;  // a torn last line
    const std::string_view line = text.substr(at, end + 1 - at);
    at = end + 1;
    std::int64_t step = 0;
    const auto [p, ec] = std::from_chars(line.data(), line.data() + line.size(), step);
    if (ec != std::errc() || *p != ',') continue;  // not a row (a repeated header)
    while (!rows.empty() && rows.back().step >= step) rows.pop_back();
    if (step <= last) rows.push_back({line, step});
  }
  std::string out(text.substr(0, header_end + 1));
  for (const Row& r : rows) out += r.line;
  dropped = lines - rows.size();
  return out;
}

// Replaces `path` with `text`: FILE.tmp written, synced and renamed over it.
void replace_file(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_SYS_CHECK(fd >= 0, "csv_monitor: create ", tmp);
  std::size_t done = 0;
  bool ok = true;
  while (ok && done < text.size()) {
    const ssize_t n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0 && errno == EINTR) continue;
    ok = n > 0;
    if (ok) done += std::size_t(n);
  }
  ok = ok && ::fsync(fd) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    ::unlink(tmp.c_str());
    errno = err;
  }
  STRATA_SYS_CHECK(ok, "csv_monitor: write ", tmp, " (the kept rows of ", path, ", which is unchanged)");
  if (::rename(tmp.c_str(), path.c_str()) != 0) {
    const int rename_err = errno;
    ::unlink(tmp.c_str());
    throw IoError(cat("csv_monitor: rename ", tmp, " over ", path, ": ", detail::errno_text(rename_err), " (",
                      path, " is unchanged)"));
  }
  // The rename itself is durable once the folder is synced; a failure here loses nothing already kept.
  const std::string dir = std::filesystem::path(path).parent_path().string();
  const int dfd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) ::fsync(dfd), ::close(dfd);
}

}  // namespace

std::string monitor_directory(const std::string& output_path, const std::string& job_name) {
  // os.path.join(output_path, job_name), which std::filesystem::path's operator/ matches.
  const std::string dir = (std::filesystem::path(output_path) / job_name).string();
  return dir.empty() ? "." : dir;
}

std::string CsvMonitor::directory(const CsvMonitorConfig& c) {
  return monitor_directory(c.output_path, c.job_name);
}

std::string CsvMonitor::file_for(const std::string& dir, std::string_view name) {
  return dir + "/" + file_stem(name) + ".csv";
}

CsvMonitor::CsvMonitor(std::string dir, std::optional<std::int64_t> resumed_at)
    : dir_(std::move(dir)), resumed_at_(resumed_at) {
  // The files of kEventPrefix's events: DIR/Train_Samples_*.csv.
  const std::string prefix = file_stem(kEventPrefix);
  std::vector<std::string> found;
  std::error_code ec;
  for (std::filesystem::directory_iterator it(dir_, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code type_ec;
    if (name.starts_with(prefix) && name.ends_with(".csv") && it->is_regular_file(type_ec))
      found.push_back(dir_ + "/" + name);
  }
  if (ec)
    throw IoError(cat("csv_monitor: list ", dir_, ": ", ec.message(),
                      "; check csv_monitor.output_path/job_name names a readable folder"));
  std::sort(found.begin(), found.end());
  adopt(found);
}

void CsvMonitor::adopt(const std::vector<std::string>& paths) {
  std::vector<std::string> changed;
  std::size_t dropped_rows = 0;
  for (const std::string& path : paths) {
    if (!adopted_.insert(path).second) continue;
    std::error_code ec;
    if (!std::filesystem::exists(path, ec)) continue;  // created with its header at the first write
    if (!resumed_at_) {
      STRATA_SYS_CHECK(::unlink(path.c_str()) == 0, "csv_monitor: remove ", path,
                       " (an earlier run's; a new run starts new files)");
      changed.push_back(path);
      continue;
    }
    const std::string text = read_all(path);
    std::size_t dropped = 0;
    const std::string kept = kept_rows(text, *resumed_at_, dropped);
    if (kept == text) continue;
    replace_file(path, kept);
    changed.push_back(path);
    dropped_rows += dropped;
  }
  if (changed.empty()) return;
  if (!resumed_at_)
    STRATA_LOG_WARN("csv_monitor: a new run (not resumed from a checkpoint) starts new files in ", dir_,
                    "; replaced ", changed.size(), " file", changed.size() == 1 ? "" : "s",
                    " of an earlier run: ", join_names(changed),
                    ". To keep an earlier run's files, move them or give this run another "
                    "csv_monitor.job_name; to continue them, resume from a checkpoint (strata train --load, "
                    "engine.load_checkpoint)");
  else
    STRATA_LOG_INFO("csv_monitor: a resumed run continues the files in ", dir_,
                    ": kept the rows with step <= ", *resumed_at_, " and dropped ", dropped_rows, " line",
                    dropped_rows == 1 ? "" : "s", " after them (later rows, torn or repeated lines) from ",
                    join_names(changed));
}

void CsvMonitor::write(std::string_view name, std::int64_t step, double value) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const std::string path = file_for(dir_, name);
    adopt({path});  // a name outside kEventPrefix: its earlier file fits this run now
    std::FILE* f = std::fopen(path.c_str(), "a");
    STRATA_SYS_CHECK(f != nullptr, "csv_monitor: open ", path, " for appending");
    it = files_.emplace(std::string(name), std::unique_ptr<std::FILE, Closer>(f)).first;
    // A file with rows already (a resumed run's, trimmed) keeps its one header.
    STRATA_SYS_CHECK(std::fseek(f, 0, SEEK_END) == 0, "csv_monitor: seek in ", path);
    if (std::ftell(f) == 0) {
      const std::size_t slash = name.rfind('/');
      const std::string_view header = slash == std::string_view::npos ? name : name.substr(slash + 1);
      STRATA_SYS_CHECK(std::fprintf(f, "step,%.*s\n", int(header.size()), header.data()) >= 0,
                       "csv_monitor: write the header of ", path);
    }
  }
  std::FILE* f = it->second.get();
  STRATA_SYS_CHECK(std::fprintf(f, "%lld,%.17g\n", (long long)step, value) >= 0 && std::fflush(f) == 0,
                   "csv_monitor: write ", file_for(dir_, name));
}

}  // namespace strata::session
