// DeepSpeed's csv_monitor file layout (tools/csv_monitor.h).
#include "tools/csv_monitor.h"

#include <cerrno>
#include <filesystem>

#include "core/error.h"

namespace strata::cli {

std::string CsvMonitor::directory(const CsvMonitorConfig& c) {
  // os.path.join(output_path, job_name), which std::filesystem::path's operator/ matches.
  const std::string dir = (std::filesystem::path(c.output_path) / c.job_name).string();
  return dir.empty() ? "." : dir;
}

std::string CsvMonitor::file_for(const std::string& dir, std::string_view name) {
  std::string file(name);
  for (char& ch : file)
    if (ch == '/' || ch == ' ') ch = '_';
  return dir + "/" + file + ".csv";
}

CsvMonitor::CsvMonitor(std::string dir) : dir_(std::move(dir)) {}

void CsvMonitor::write(std::string_view name, std::int64_t step, double value) {
  auto it = files_.find(name);
  if (it == files_.end()) {
    const std::string path = file_for(dir_, name);
    std::FILE* f = std::fopen(path.c_str(), "a");
    STRATA_SYS_CHECK(f != nullptr, "csv_monitor: open ", path, " for appending");
    it = files_.emplace(std::string(name), std::unique_ptr<std::FILE, Closer>(f)).first;
    // A file with rows already (a resumed run) keeps its one header.
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

}  // namespace strata::cli
