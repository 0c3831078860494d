// strata/core/files.h: facts about directories that several modules check — the space free for this
// user, and whether files can be created in one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace strata {

// Bytes an unprivileged write can still use on the file system holding `path` (statvfs f_bavail);
// nullopt when it cannot be asked.
std::optional<std::uint64_t> free_disk_bytes(const std::string& path);

// 0 when a file can be created in directory `dir`, else the errno of the attempt. It creates and removes
// a real file: access(W_OK) says yes to root on a read-only mount and does not see quotas.
int probe_writable(const std::string& dir);

// Creates `dir` (and its parents) if needed and checks that files can be created in it (probe_writable), so
// that a command refuses a destination it cannot write before it loads or trains anything. ConfigError naming
// `what` — what the user typed for it ("--export", "OUT_DIR") —, the path and the reason when `dir` is a
// file, cannot be created or is not writable.
void check_output_dir(const std::string& dir, std::string_view what);

}  // namespace strata
