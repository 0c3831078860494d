// strata/core/arena_pin.h: pins the threads of a oneTBB arena to cpus while they work in it (header-only:
// the libraries that use it link oneTBB; core does not).
//
//   tbb::task_arena arena(int(cpus.size()));
//   strata::ArenaPin pin(arena, cpus);   // slot k runs on cpus[k % cpus.size()] inside the arena
//
// Each thread entering the arena (a worker, or the thread calling execute()) is bound to one cpu, chosen
// by its arena slot, and gets its previous affinity back when it leaves. A cpu the kernel refuses is
// reported once (a warning) and the thread runs unpinned.
#pragma once

#include <pthread.h>
#include <sched.h>
#include <tbb/task_arena.h>
#include <tbb/task_scheduler_observer.h>

#include <algorithm>
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "core/error.h"
#include "core/log.h"
#include "core/topology.h"

namespace strata {

class ArenaPin : public tbb::task_scheduler_observer {
 public:
  // `what` names the arena's users in the warning ("optimizer", "compute").
  ArenaPin(tbb::task_arena& arena, std::vector<int> cpus, std::string what)
      : tbb::task_scheduler_observer(arena), cpus_(std::move(cpus)), what_(std::move(what)) {
    observe(true);
  }
  ~ArenaPin() override { observe(false); }
  ArenaPin(const ArenaPin&) = delete;
  ArenaPin& operator=(const ArenaPin&) = delete;

  void on_scheduler_entry(bool /*is_worker*/) override {
    if (cpus_.empty()) return;
    Saved& s = saved();
    s.valid = pthread_getaffinity_np(pthread_self(), sizeof(s.mask), &s.mask) == 0;
    const int slot = std::max(0, tbb::this_task_arena::current_thread_index());
    try {
      pin_current_thread({cpus_[std::size_t(slot) % cpus_.size()]});
    } catch (const Error& e) {
      STRATA_WARN_ONCE("cannot pin the ", what_, " threads (", e.what(), "); running unpinned");
    }
  }
  void on_scheduler_exit(bool /*is_worker*/) override {
    Saved& s = saved();
    if (s.valid) pthread_setaffinity_np(pthread_self(), sizeof(s.mask), &s.mask);
    s.valid = false;
  }

 private:
  struct Saved {
    cpu_set_t mask;
    bool valid = false;
  };
  static Saved& saved() {
    thread_local Saved s;
    return s;
  }
  std::vector<int> cpus_;
  std::string what_;
};

}  // namespace strata
