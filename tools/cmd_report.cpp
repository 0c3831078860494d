// `strata report`: what this build and this machine support (DeepSpeed's ds_report). Each line says OK
// or why not, so a user can fix their environment before a long run fails.
#include <fcntl.h>
#include <libaio.h>
#include <liburing.h>
#define OMPI_SKIP_MPICXX 1  // the C API only
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <string>

#ifdef STRATA_WITH_CUDA
#include <cublasLt.h>
#include <cuda_runtime.h>
#include <nccl.h>
#endif

#include "core/device.h"
#include "core/error.h"
#include "core/topology.h"
#include "tools/cli.h"
#include "tools/report_simd.h"
#include "zero3/machine.h"

namespace strata::cli {
namespace {

using detail::cat;

struct Row {
  std::string what;
  bool ok;
  std::string detail;
};

void print(const Row& r) {
  std::printf("  %-22s %-4s %s\n", r.what.c_str(), r.ok ? "OK" : "NO", r.detail.c_str());
}

Row build_row() {
#ifdef NDEBUG
  const char* type = "Release";
#else
  const char* type = "Debug";
#endif
  return {"build", true,
          cat("strata ", STRATA_VERSION, ", ", type, ", ", STRATA_COMPILER, " C++", __cplusplus / 100)};
}

#ifdef STRATA_WITH_CUDA
std::string cuda_version(int v) {
  return cat(v / 1000, ".", (v % 1000) / 10);
}
#endif

void cuda_rows() {
#ifdef STRATA_WITH_CUDA
  int rt = 0, drv = 0;
  cudaRuntimeGetVersion(&rt);
  cudaError_t de = cudaDriverGetVersion(&drv);
  print({"CUDA runtime", true,
         cat("built against ", cuda_version(CUDART_VERSION), ", runtime ", cuda_version(rt))});
  if (de != cudaSuccess || drv == 0)
    print({"CUDA driver", false,
           "no CUDA driver installed (libcuda.so not loadable): GPU backends unavailable"});
  else
    print({"CUDA driver", true, cat("supports CUDA ", cuda_version(drv))});
  size_t lt = cublasLtGetVersion();
  print({"cuBLASLt", true, cat(lt / 10000, ".", (lt % 10000) / 100, ".", lt % 100)});
  int nv = 0;
  if (ncclGetVersion(&nv) == ncclSuccess)
    print({"NCCL", true, cat(nv / 10000, ".", (nv % 10000) / 100, ".", nv % 100)});
  else
    print({"NCCL", false, "ncclGetVersion failed"});
  std::string why;
  int n = cuda_device_count(&why);
  if (n == 0) {
    print({"GPUs", false, cat("none visible (", why, "); the host backend will be used")});
  } else {
    for (int i = 0; i < n; ++i) {
      cudaDeviceProp p{};
      cudaGetDeviceProperties(&p, i);
      print({cat("GPU ", i), true,
             cat(p.name, ", ", format_bytes(p.totalGlobalMem), ", sm_", p.major, p.minor, ", ",
                 p.multiProcessorCount, " SMs, NUMA node ", Topology::get().gpu_numa_node(i))});
    }
  }
#else
  print({"CUDA", false, "not built (configured with STRATA_CUDA=OFF or no nvcc found at build time)"});
  print({"cuBLASLt", false, "not built"});
  print({"NCCL", false, "not built"});
  print({"GPUs", false, "cuda backend not built; the host backend will be used"});
#endif
}

Row io_uring_row() {
  struct io_uring ring;
  int rc = io_uring_queue_init(8, &ring, 0);
  if (rc < 0)
    return {"io_uring", false,
            cat("io_uring_queue_init failed: ", detail::errno_text(-rc),
                " (kernel too old, or disabled by sysctl kernel.io_uring_disabled / a seccomp policy); "
                "strata.aio.backend auto falls back to libaio or psync")};
  unsigned features = ring.features;
  io_uring_queue_exit(&ring);
  char feat[32];
  std::snprintf(feat, sizeof feat, "0x%x", features);
  return {"io_uring", true, cat("ring set up (kernel features ", feat, ")")};
}

Row libaio_row() {
  io_context_t ctx{};
  int rc = io_setup(8, &ctx);
  if (rc < 0)
    return {"libaio", false,
            cat("io_setup failed: ", detail::errno_text(-rc), " (check /proc/sys/fs/aio-max-nr)")};
  io_destroy(ctx);
  return {"libaio", true, "context set up"};
}

Row odirect_row(const std::string& dir) {
  if (dir.empty()) return {"O_DIRECT", true, "not checked (pass --nvme-path DIR to check a directory)"};
  std::string path = dir + "/.strata-report-XXXXXX";
  int fd = ::mkstemp(path.data());
  if (fd < 0)
    return {"O_DIRECT", false,
            cat("cannot create a file in ", dir, ": ", detail::errno_text(errno),
                " (nvme_path must exist and be writable)")};
  ::close(fd);
  struct Cleanup {
    std::string p;
    ~Cleanup() { ::unlink(p.c_str()); }
  } cleanup{path};
  fd = ::open(path.c_str(), O_RDWR | O_DIRECT);
  if (fd < 0)
    return {"O_DIRECT", false,
            cat(dir, " refuses O_DIRECT (", detail::errno_text(errno),
                "); swap I/O there falls back to buffered I/O (slower, uses page cache)")};
  void* buf = nullptr;
  std::size_t n = 1 << 16;
  if (posix_memalign(&buf, 4096, n) != 0) {
    ::close(fd);
    return {"O_DIRECT", false, "cannot allocate an aligned buffer"};
  }
  std::memset(buf, 0x5a, n);
  ssize_t w = ::pwrite(fd, buf, n, 0);
  int werr = errno;
  std::memset(buf, 0, n);
  ssize_t r = w == ssize_t(n) ? ::pread(fd, buf, n, 0) : -1;
  bool same = r == ssize_t(n) && static_cast<unsigned char*>(buf)[n - 1] == 0x5a;
  std::free(buf);
  ::close(fd);
  if (w != ssize_t(n))
    return {"O_DIRECT", false, cat("aligned O_DIRECT write in ", dir, " failed: ", detail::errno_text(werr))};
  if (!same) return {"O_DIRECT", false, cat("O_DIRECT read-back in ", dir, " returned different bytes")};
  return {"O_DIRECT", true, cat("aligned 64 KiB write and read-back in ", dir)};
}

Row memlock_row() {
  struct rlimit rl {};
  ::getrlimit(RLIMIT_MEMLOCK, &rl);
  if (rl.rlim_cur == RLIM_INFINITY) return {"RLIMIT_MEMLOCK", true, "unlimited"};
  bool ok = rl.rlim_cur >= (1ull << 30);
  return {"RLIMIT_MEMLOCK", ok,
          cat(format_bytes(rl.rlim_cur),
              ok ? ""
                 : "; pinned host memory beyond it is left unlocked on the host backend (cuda: cudaHostAlloc "
                   "may fail). Raise it: ulimit -l unlimited, or memlock in /etc/security/limits.conf")};
}

Row mpi_row() {
  char lib[MPI_MAX_LIBRARY_VERSION_STRING] = {};
  int len = 0, major = 0, minor = 0;
  MPI_Get_version(&major, &minor);
  MPI_Get_library_version(lib, &len);
  std::string s(lib, std::size_t(len));
  if (auto nl = s.find_first_of(",\n"); nl != std::string::npos) s.resize(nl);
  return {"MPI", true, cat(s, " (MPI ", major, ".", minor, ")")};
}

int run_report(const std::string& nvme_path) {
  std::printf("Strata report\n");
  print(build_row());
  print({"CPU", true, cat(zero3::cpu_model_name(), ", ", Topology::get().summary())});
  for (const auto& [what, ok, d] : simd_rows()) print({what, ok, d});
  cuda_rows();
  print(io_uring_row());
  print(libaio_row());
  print(odirect_row(nvme_path));
  print(memlock_row());
  print(mpi_row());
  return 0;
}

Command report("report", "Print what this build and machine support (CUDA, SIMD, io_uring, O_DIRECT, ...)",
               [](CLI::App& sub) {
                 auto path = std::make_shared<std::string>();
                 sub.add_option("--nvme-path", *path, "Directory to check for O_DIRECT (an nvme_path)");
                 return [path] { return run_report(*path); };
               });

}  // namespace
}  // namespace strata::cli
