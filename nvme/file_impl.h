// strata/nvme/file_impl.h: internals of File that tests reach into. Not part of the public API.
#pragma once

#include <sys/types.h>

namespace strata::nvme::detail {

// The open(2) used for a File's O_DIRECT descriptor. Tests swap in one that fails with EINVAL to take
// the buffered fallback on file systems that accept O_DIRECT. Returns the previous function.
using OpenFn = int (*)(const char* path, int flags, mode_t mode);
OpenFn exchange_direct_open(OpenFn fn);

}  // namespace strata::nvme::detail
