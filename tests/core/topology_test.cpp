// Topology: hwloc sees this machine's cpus, and threads can be pinned to them.
#include <gtest/gtest.h>
#include <sched.h>

#include <algorithm>
#include <thread>

#include "core/error.h"
#include "core/topology.h"

namespace strata {
namespace {

TEST(Topology, ListsEveryCpuThisProcessMayUseInSomeNumaNode) {
  const Topology& t = Topology::get();
  ASSERT_GE(t.numa_nodes().size(), 1u);
  std::vector<int> cpus = t.all_cpus();
  ASSERT_FALSE(cpus.empty());
  EXPECT_EQ(int(cpus.size()), t.pus());
  cpu_set_t allowed;
  ASSERT_EQ(sched_getaffinity(0, sizeof allowed, &allowed), 0);
  for (int c = 0; c < CPU_SETSIZE; ++c) {
    if (CPU_ISSET(c, &allowed)) {
      EXPECT_NE(std::find(cpus.begin(), cpus.end(), c), cpus.end()) << "cpu " << c;
    }
  }
}

TEST(Topology, APinnedThreadRunsOnlyOnItsCpu) {
  int last = Topology::get().all_cpus().back();
  int seen = -1;
  std::thread th([&] {
    pin_current_thread({last});
    for (int i = 0; i < 1000; ++i) std::this_thread::yield();
    seen = sched_getcpu();
  });
  th.join();
  EXPECT_EQ(seen, last);
}

TEST(Topology, PinningToACpuOutsideTheMachineFailsNamingIt) {
  std::thread th([] {
    try {
      pin_current_thread({CPU_SETSIZE - 1});
      ADD_FAILURE() << "no error";
    } catch (const BackendError& e) {
      EXPECT_NE(std::string(e.what()).find(std::to_string(CPU_SETSIZE - 1)), std::string::npos) << e.what();
    }
  });
  th.join();
}

TEST(Topology, GpuNumaNodeIsUnknownWithoutAGpu) {
  EXPECT_EQ(Topology::get().gpu_numa_node(64), -1);
}

}  // namespace
}  // namespace strata
