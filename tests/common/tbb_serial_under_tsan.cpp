// Linked into every GoogleTest binary of a ThreadSanitizer build (STRATA_SANITIZE=thread, see
// tests/CMakeLists.txt): oneTBB runs every parallel loop on the thread that calls it.
//
// Note [TSan and oneTBB]: libtbb is not built with TSan, so the hand-off of a parallel_for's tasks to its
// worker threads and the join back are invisible to it; every write a task makes and the caller reads
// after the loop is reported as a race (and TBB's own partitioner, compiled into our objects from its
// headers, races with its uninstrumented half). With one thread allowed there are no workers and no such
// reports, while the threads Strata starts itself — device streams, tier-manager movers, the NVMe engine,
// the prefetcher, the trace writer — run as always and are what the tsan stage checks. The parallel loops'
// independence of the thread count is the kernels' determinism tests' business.
#include <tbb/global_control.h>

namespace {

const tbb::global_control one_thread(tbb::global_control::max_allowed_parallelism, 1);

}  // namespace
