// strata/core/topology.h: what the machine looks like (hwloc), and pinning threads to cores.
//
// Example:
//   const strata::Topology& topo = strata::Topology::get();
//   std::vector<int> cpus = topo.cpus_of_numa(topo.gpu_numa_node(0));   // cores nearest GPU 0
//   strata::pin_current_thread({cpus[i % cpus.size()]});
//
// Queried once per process and cached; safe to call from any thread.
#pragma once

#include <string>
#include <vector>

namespace strata {

struct NumaNode {
  int os_index = 0;
  std::vector<int> cpus;          // OS processor ids in this node
  unsigned long long memory = 0;  // bytes of local memory, 0 if unknown
};

class Topology {
 public:
  static const Topology& get();

  int cores() const { return cores_; }  // physical cores
  int pus() const { return pus_; }      // logical processors (hardware threads)
  const std::vector<NumaNode>& numa_nodes() const { return numa_; }
  std::vector<int> all_cpus() const;
  std::vector<int> cpus_of_numa(int os_index) const;  // all_cpus() when the node is unknown
  // NUMA node nearest to CUDA device `ordinal` (from its PCI bus id), or -1 when unknown / no CUDA.
  int gpu_numa_node(int ordinal) const;
  std::string summary() const;  // "2 cores, 2 PUs, 1 NUMA node (0: 2 cpus, 23.4 GiB)"

 private:
  Topology();
  int cores_ = 0, pus_ = 0;
  std::vector<NumaNode> numa_;
  std::vector<std::string> gpu_pci_;  // PCI bus ids by CUDA ordinal, filled lazily by gpu_numa_node
};

// The cpus this process may run on (sched_getaffinity: what mpirun --bind-to, taskset or a cgroup allows),
// ascending, as they were at the first call — made before any thread pins itself (the engine asks first
// thing), so later pinning does not narrow it.
std::vector<int> allowed_cpus();

// Binds the calling thread to the given OS cpu ids (empty: no-op). Throws BackendError when the kernel
// refuses (e.g. a cpu outside the process's allowed set), naming the cpus.
void pin_current_thread(const std::vector<int>& cpus);

}  // namespace strata
