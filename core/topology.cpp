#include "core/topology.h"

#include <hwloc.h>
#include <pthread.h>
#include <sched.h>

#include <algorithm>
#include <cctype>
#include <fstream>
#include <mutex>

#ifdef STRATA_WITH_CUDA
#include <cuda_runtime.h>
#endif

#include "core/error.h"

namespace strata {
namespace {

std::vector<int> cpus_of(hwloc_const_cpuset_t set) {
  std::vector<int> out;
  unsigned i;
  hwloc_bitmap_foreach_begin(i, set) out.push_back(int(i));
  hwloc_bitmap_foreach_end();
  return out;
}

}  // namespace

const Topology& Topology::get() {
  static Topology t;
  return t;
}

Topology::Topology() {
  hwloc_topology_t topo;
  if (hwloc_topology_init(&topo) != 0 || hwloc_topology_load(topo) != 0) {
    cores_ = pus_ = 1;
    return;
  }
  cores_ = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_CORE));
  pus_ = std::max(1, hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_PU));
  int n = hwloc_get_nbobjs_by_type(topo, HWLOC_OBJ_NUMANODE);
  for (int i = 0; i < n; ++i) {
    hwloc_obj_t o = hwloc_get_obj_by_type(topo, HWLOC_OBJ_NUMANODE, unsigned(i));
    NumaNode node;
    node.os_index = int(o->os_index);
    node.cpus = cpus_of(o->cpuset);
    node.memory = o->attr ? o->attr->numanode.local_memory : 0;
    numa_.push_back(std::move(node));
  }
  if (numa_.empty()) numa_.push_back(NumaNode{0, cpus_of(hwloc_topology_get_topology_cpuset(topo)), 0});
  hwloc_topology_destroy(topo);
}

std::vector<int> Topology::all_cpus() const {
  std::vector<int> all;
  for (auto& n : numa_) all.insert(all.end(), n.cpus.begin(), n.cpus.end());
  std::sort(all.begin(), all.end());
  all.erase(std::unique(all.begin(), all.end()), all.end());
  return all;
}

std::vector<int> Topology::cpus_of_numa(int os_index) const {
  for (auto& n : numa_)
    if (n.os_index == os_index) return n.cpus;
  return all_cpus();
}

int Topology::gpu_numa_node(int ordinal) const {
#ifdef STRATA_WITH_CUDA
  char bus[32] = {};
  if (cudaDeviceGetPCIBusId(bus, sizeof bus, ordinal) != cudaSuccess) {
    cudaGetLastError();
    return -1;
  }
  std::string id(bus);
  for (char& c : id) c = char(std::tolower(static_cast<unsigned char>(c)));
  // The PCI bus id is "0000:3b:00.0"; sysfs names the device the same way.
  std::ifstream f("/sys/bus/pci/devices/" + id + "/numa_node");
  int node = -1;
  if (f >> node) return node;
  return -1;
#else
  (void)ordinal;
  return -1;
#endif
}

std::string Topology::summary() const {
  std::string s = detail::cat(cores_, " cores, ", pus_, " PUs, ", numa_.size(), " NUMA node",
                              numa_.size() == 1 ? "" : "s", " (");
  for (std::size_t i = 0; i < numa_.size(); ++i) {
    if (i) s += "; ";
    s += detail::cat(numa_[i].os_index, ": ", numa_[i].cpus.size(), " cpus");
    if (numa_[i].memory) s += detail::cat(", ", format_bytes(numa_[i].memory));
  }
  return s + ")";
}

std::vector<int> allowed_cpus() {
  static const std::vector<int> cpus = [] {
    std::vector<int> v;
    cpu_set_t set;
    CPU_ZERO(&set);
    if (sched_getaffinity(0, sizeof set, &set) == 0) {
      for (int c = 0; c < CPU_SETSIZE; ++c)
        if (CPU_ISSET(c, &set)) v.push_back(c);
    }
    if (v.empty()) v = Topology::get().all_cpus();
    return v;
  }();
  return cpus;
}

void pin_current_thread(const std::vector<int>& cpus) {
  if (cpus.empty()) return;
  cpu_set_t set;
  CPU_ZERO(&set);
  for (int c : cpus) {
    STRATA_CHECK(c >= 0 && c < CPU_SETSIZE, "cpu id ", c, " is out of range");
    CPU_SET(c, &set);
  }
  int rc = pthread_setaffinity_np(pthread_self(), sizeof set, &set);
  if (rc != 0) {
    std::string list;
    for (int c : cpus) list += detail::cat(list.empty() ? "" : ",", c);
    throw BackendError(
        detail::cat("cannot pin thread to cpus {", list, "}: ", detail::errno_text(rc),
                    "; check the process's allowed cpus (taskset -p, cgroup cpuset) or disable "
                    "thread pinning (strata.cpu_optim.pin_threads)"));
  }
}

}  // namespace strata
