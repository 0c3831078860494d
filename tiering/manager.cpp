// The tier manager: registry, placement and eviction policy, accounting, and the public API. The
// transfers themselves (issue and the mover threads) are in tiering/moves.cpp.
#include <algorithm>
#include <cstdio>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "tiering/manager_impl.h"

namespace strata::tiering {

using detail::Tensor;
using strata::detail::cat;

// ---------------------------------------------------------------- Impl: construction

AllocatorOptions device_allocator_options(const TierOptions& opts) {
  AllocatorOptions da;
  da.name = "device";
  da.capacity = opts.device_budget;
  da.setting = "strata.device_memory_cap";
  da.exact_segments = opts.device_exact_segments;
  return da;
}

TierManager::Impl::Impl(Device& d, TierOptions o, nvme::SwapStore* s)
    : dev(d), opts(std::move(o)), swap(s), ring(opts.event_ring_capacity) {
  if (opts.pinned_budget == 0)
    throw ConfigError(
        "tiering: the pinned host budget is 0; pinned memory stages every NVMe <-> device move, so give it "
        "room for at least the largest tensor (" +
        opts.pinned_setting + ")");
  pools[int(Tier::device)] = make_caching_pool(
      Tier::device, make_device_allocator(dev, device_allocator_options(opts)), dev.caps().host_addressable);
  PinnedSlabOptions po;
  po.capacity = opts.pinned_budget;
  po.slab_bytes = opts.pinned_slab_bytes;
  if (swap && opts.register_pinned_slabs) {
    nvme::AioEngine* engine = &swap->engine();
    po.on_slab = [engine](void* p, std::size_t n) { engine->register_buffers(p, n); };
    po.on_release = [engine](void* p, std::size_t) { engine->unregister_buffers(p); };
  }
  pools[int(Tier::pinned)] = make_caching_pool(Tier::pinned, make_pinned_allocator(dev, po), true);
  if (swap) pools[int(Tier::nvme)] = make_nvme_pool(*swap);
  h2d = dev.create_stream("tiering-h2d");
  d2h = dev.create_stream("tiering-d2h");
  up = std::make_unique<detail::Mover>("tiering-up", [this](const auto& j) { run_job(j); });
  down = std::make_unique<detail::Mover>("tiering-down", [this](const auto& j) { run_job(j); });
}

TierManager::Impl::~Impl() {
  // Nothing else runs now but the movers: wait for every flight, account for it, free everything.
  for (auto& [id, t] : tensors)
    if (t.flight) t.flight->done.wait();
  process_completions();
  for (auto& [id, t] : tensors)
    for (int tier = 0; tier < kTierCount; ++tier)
      if (t.block[tier]) pools[tier]->free(t.block[tier], nullptr);
  tensors.clear();
}

// ---------------------------------------------------------------- Impl: helpers (mu held)

std::int64_t TierManager::Impl::now() const {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - epoch)
      .count();
}

void TierManager::Impl::record(EventType type, Tier tier, Tier to, Kind kind, TensorId id,
                               std::uint64_t bytes, std::int64_t t) {
  MemEvent e;
  e.t_ns = t >= 0 ? t : now();
  e.type = type;
  e.tier = tier;
  e.to = to;
  e.kind = kind;
  e.phase = phase;
  e.tensor = id;
  e.bytes = bytes;
  e.step = step;
  ring.push(e);
}

Tensor& TierManager::Impl::get(TensorId id, const char* what) {
  auto it = tensors.find(id);
  if (it == tensors.end())
    throw Error(
        cat("tiering ", what, ": tensor id ", id, " is not registered",
            described.count(id) ? cat(" (it was \"", described[id].name, "\", since unregistered)") : ""));
  return it->second;
}

TensorId TierManager::Impl::add(const TensorDesc& d) {
  STRATA_CHECK(d.bytes > 0, "tiering: tensor \"", d.name, "\" has 0 bytes");
  if (d.home == Tier::nvme && !pools[int(Tier::nvme)])
    throw ConfigError(cat("tiering: tensor \"", d.name,
                          "\" has its home on NVMe, but the tier manager has no NVMe store; set "
                          "zero_optimization.offload_param.nvme_path / offload_optimizer.nvme_path"));
  TensorId id = next_id++;
  Tensor& t = tensors[id];
  t.id = id;
  t.desc = d;
  touch(t);
  described[id] = d;
  record(EventType::tensor_added, d.home, d.home, d.kind, id, d.bytes);
  return id;
}

State TierManager::Impl::state_of(const Tensor& t) const {
  if (t.flight) return State::in_flight;
  if (t.valid == 0) return State::absent;
  return has(t.valid, t.desc.home) ? State::resident : State::dirty;
}

void TierManager::Impl::process_completions() {
  std::vector<detail::Completion> batch;
  {
    std::lock_guard<std::mutex> lk(done_mu);
    batch.swap(completed);
  }
  for (detail::Completion& c : batch) {
    detail::MoveJob& j = *c.job;
    Tensor& t = tensors.at(j.id);  // a tensor with a move in flight is never unregistered
    if (!c.finished) {             // an eviction's source has been read: its bytes are gone from `from`
      acct.sub(j.from, j.kind, j.bytes);
      record(EventType::free, j.from, j.from, j.kind, j.id, j.bytes, j.t_read);
      continue;
    }
    if (j.staging) {
      acct.sub(Tier::pinned, Kind::staging, j.bytes);
      record(EventType::free, Tier::pinned, Tier::pinned, Kind::staging, j.id, j.bytes, j.t_done);
    }
    if (j.error) {
      ++acct.failed_moves;
      record(EventType::move_failed, j.from, j.to, j.kind, j.id, j.bytes, j.t_done);
      pools[int(j.to)]->free(t.block[int(j.to)], nullptr);
      t.block[int(j.to)] = {};
      t.valid &= TierMask(~bit(j.to));
      acct.sub(j.to, j.kind, j.bytes);
      record(EventType::free, j.to, j.to, j.kind, j.id, j.bytes, j.t_done);
      if (t.valid == 0) {
        std::string why;
        try {
          std::rethrow_exception(j.error);
        } catch (const std::exception& e) {
          why = e.what();
        }
        t.lost = cat("its only copy was being moved ", to_string(j.from), " -> ", to_string(j.to),
                     " when the move failed: ", why);
        STRATA_LOG_ERROR("tiering: tensor \"", t.desc.name, "\" lost its data: ", t.lost);
      }
    } else {
      t.valid |= bit(j.to);
      MoveCounter& mc = acct.moves[direction(j.from, j.to)];
      ++mc.count;
      mc.bytes += j.bytes;
      record(EventType::move_done, j.from, j.to, j.kind, j.id, j.bytes, j.t_done);
    }
    if (t.flight == c.job) t.flight.reset();
  }
}

Tensor& TierManager::Impl::settle(std::unique_lock<std::mutex>& lk, TensorId id, const char* what) {
  for (;;) {
    process_completions();
    Tensor& t = get(id, what);
    if (!t.flight) return t;
    std::shared_ptr<detail::MoveJob> j = t.flight;
    lk.unlock();
    j->done.wait();
    lk.lock();
  }
}

PoolBlock TierManager::Impl::place(Tier tier, std::uint64_t bytes, Kind kind, TensorId id,
                                   const std::string& name) {
  TierPool* pool = pools[int(tier)].get();
  if (!pool)
    throw ConfigError(cat("tiering: \"", name,
                          "\" cannot go to NVMe: the tier manager has no NVMe store; set ",
                          opts.nvme_setting));
  for (;;) {
    PoolBlock b = pool->try_allocate(bytes);
    if (b) {
      // A block freed by a finished move may have been reused just now: account that move first, so that
      // the per-kind bytes never count one piece of memory twice.
      process_completions();
      acct.add(tier, kind, bytes);
      record(EventType::alloc, tier, tier, kind, id, bytes);
      return b;
    }
    if (Tensor* v = victim(tier)) {
      evict_one(*v, tier);
      continue;
    }
    // Tensors moving off or onto this tier become evictable when their move ends: wait for the oldest
    // (its mover never needs our mutex), then look again.
    std::shared_ptr<detail::MoveJob> oldest;
    for (auto& [tid, t] : tensors)
      if (t.block[int(tier)] && t.flight && t.pins == 0 && (!oldest || t.flight->t_issue < oldest->t_issue))
        oldest = t.flight;
    if (!oldest) out_of_memory(tier, bytes, kind, name);
    oldest->done.wait();
    process_completions();
  }
}

void TierManager::Impl::release(Tensor& t, Tier tier, std::shared_ptr<const Fence> last_use) {
  PoolBlock& b = t.block[int(tier)];
  if (!b) return;
  pools[int(tier)]->free(b, std::move(last_use));
  b = {};
  t.valid &= TierMask(~bit(tier));
  acct.sub(tier, t.desc.kind, t.desc.bytes);
  record(EventType::free, tier, tier, t.desc.kind, t.id, t.desc.bytes);
}

// Note [eviction order]
// The victim is the least recently used tensor with a block on the tier that is not pinned, not moving,
// and not part of the move being set up (busy). A tensor whose copy there is stale, or that has a valid
// copy on another tier, is dropped without a transfer; any other must go one tier down, so on the
// bottom tier (or above a missing one) it is not a candidate. A linear scan: there are a few tensors per
// chunk and evictions are whole tensors, so this is not where time goes.
Tensor* TierManager::Impl::victim(Tier tier) {
  Tensor* best = nullptr;
  bool below = tier != Tier::nvme && pools[int(tier) + 1] != nullptr;
  for (auto& [id, t] : tensors) {
    if (!t.block[int(tier)] || t.pins > 0 || t.busy || t.flight) continue;
    bool elsewhere = !has(t.valid, tier) || (t.valid & TierMask(~bit(tier))) != 0;
    if (!elsewhere && !below) continue;
    if (!best || t.last_use < best->last_use) best = &t;
  }
  return best;
}

void TierManager::Impl::evict_one(Tensor& v, Tier tier) {
  ++acct.evictions;
  acct.evicted_bytes += v.desc.bytes;
  bool elsewhere = !has(v.valid, tier) || (v.valid & TierMask(~bit(tier))) != 0;
  if (elsewhere) {
    record(EventType::evict, tier, tier, v.desc.kind, v.id, v.desc.bytes);
    release(v, tier, nullptr);
    return;
  }
  Tier below = Tier(int(tier) + 1);
  record(EventType::evict, tier, below, v.desc.kind, v.id, v.desc.bytes);
  issue(v, tier, below, /*drop_source=*/true, nullptr);
}

void TierManager::Impl::out_of_memory(Tier tier, std::uint64_t bytes, Kind kind, const std::string& name) {
  ++acct.ooms;
  record(EventType::oom, tier, tier, kind, 0, bytes);
  int pinned = 0, moving = 0, bottom = 0;
  bool below = tier != Tier::nvme && pools[int(tier) + 1] != nullptr;
  for (auto& [id, t] : tensors) {
    if (!t.block[int(tier)]) continue;
    if (t.pins > 0)
      ++pinned;
    else if (t.flight || t.busy)
      ++moving;
    else if (!below)
      ++bottom;
  }
  std::ostringstream os;
  os << "out of memory on the " << to_string(tier) << " tier: cannot place " << format_bytes(bytes)
     << " for \"" << name << "\" (" << to_string(kind) << "), and no tensor there can be evicted (" << pinned
     << " pinned, " << moving << " moving";
  if (!below) os << ", " << bottom << " with no tier below";
  os << ").\n";
  char line[256];
  std::snprintf(line, sizeof line, "  %-7s %16s %16s %16s %16s\n", "tier", "capacity", "used", "reserved",
                "free");
  os << line;
  auto mib = [](std::uint64_t b) { return format_size(b); };
  for (int t = 0; t < kTierCount; ++t) {
    if (!pools[t]) {
      std::snprintf(line, sizeof line, "  %-7s %16s\n", to_string(Tier(t)), "not configured");
      os << line;
      continue;
    }
    PoolStats s = pools[t]->stats();
    std::snprintf(line, sizeof line, "  %-7s %16s %16s %16s %16s\n", to_string(Tier(t)),
                  s.capacity ? mib(s.capacity).c_str() : "unlimited", mib(s.used.current).c_str(),
                  mib(s.reserved.current).c_str(), mib(s.free).c_str());
    os << line;
  }
  const std::string& setting = tier == Tier::device   ? opts.device_setting
                               : tier == Tier::pinned ? opts.pinned_setting
                                                      : opts.nvme_setting;
  os << "To fit, change " << setting << ".";
  if (pinned > 0) os << " Or unpin tensors held on this tier (" << pinned << " are pinned).";
  throw OutOfMemory(os.str());
}

std::shared_ptr<const Fence> TierManager::Impl::fence_after(const Event* after) {
  if (!after) return nullptr;
  std::unique_ptr<Event> e = dev.create_event();
  d2h->wait(*after);
  d2h->record(*e);
  return std::make_shared<EventFence>(std::move(e));
}

TierSnapshot TierManager::Impl::tier_snapshot(Tier t) const {
  TierSnapshot s;
  const TierPool* pool = pools[int(t)].get();
  s.by_kind = acct.bytes[int(t)];
  s.total = acct.tier_bytes[int(t)];
  if (!pool) return s;
  PoolStats p = pool->stats();
  s.present = true;
  s.capacity = p.capacity;
  s.used = p.used.current;
  s.reserved = p.reserved.current;
  s.free = p.free;
  s.pending = p.pending;
  s.retries = p.retries;
  s.ooms = p.ooms;
  if (const CachingAllocator* a = pool->allocator()) {
    s.has_allocator = true;
    s.allocator = a->stats();
  }
  return s;
}

// ---------------------------------------------------------------- public API

using detail::Busy;

TierManager::TierManager(Device& dev, TierOptions opts, nvme::SwapStore* nvme)
    : impl_(std::make_unique<Impl>(dev, std::move(opts), nvme)) {}

TierManager::~TierManager() = default;

TensorId TierManager::register_tensor(const TensorDesc& d) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  return impl_->add(d);
}

ShardTensors TierManager::register_shard(const ShardDesc& d) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto one = [&](const char* suffix, Kind k, DType dt, Tier home) {
    const std::uint64_t n = k == Kind::param && d.param_numel ? d.param_numel : d.numel;
    return impl_->add({.name = d.prefix + "." + suffix,
                       .kind = k,
                       .dtype = dt,
                       .bytes = n * dtype_bytes(dt),
                       .home = home,
                       .chunk = d.chunk,
                       .shard = d.shard});
  };
  ShardTensors s;
  if (d.param_bytes > 0)
    s.param = impl_->add({.name = d.prefix + ".param",
                          .kind = Kind::param,
                          .dtype = DType::u8,
                          .bytes = d.param_bytes,
                          .home = d.homes.param,
                          .chunk = d.chunk,
                          .shard = d.shard});
  else
    s.param = one("param", Kind::param, d.working, d.homes.param);
  if (d.param_only) return s;
  s.grad = one("grad", Kind::grad, DType::fp32, d.homes.grad);
  s.master = one("master", Kind::master, DType::fp32, d.homes.master);
  s.exp_avg = one("exp_avg", Kind::exp_avg, DType::fp32, d.homes.optim);
  s.exp_avg_sq = one("exp_avg_sq", Kind::exp_avg_sq, DType::fp32, d.homes.optim);
  return s;
}

void TierManager::unregister_tensor(TensorId id, const Event* after) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "unregister_tensor");
  std::shared_ptr<const Fence> fence = impl_->fence_after(after);
  for (int tier = 0; tier < kTierCount; ++tier) impl_->release(t, Tier(tier), fence);
  impl_->record(EventType::tensor_removed, t.desc.home, t.desc.home, t.desc.kind, id, t.desc.bytes);
  impl_->tensors.erase(id);
}

TensorInfo TierManager::info(TensorId id) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_completions();
  const Tensor& t = impl_->get(id, "info");
  TensorInfo i;
  i.desc = t.desc;
  i.valid = t.valid;
  for (int tier = 0; tier < kTierCount; ++tier)
    if (t.block[tier]) i.allocated |= bit(Tier(tier));
  i.state = impl_->state_of(t);
  i.pins = t.pins;
  i.lost = t.lost;
  return i;
}

std::vector<TensorId> TierManager::tensor_ids() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  std::vector<TensorId> ids;
  for (auto& [id, t] : impl_->tensors) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

std::optional<TensorDesc> TierManager::describe(TensorId id) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  auto it = impl_->described.find(id);
  if (it == impl_->described.end()) return std::nullopt;
  return it->second;
}

void* TierManager::allocate(TensorId id, Tier tier) {
  if (tier == Tier::nvme)
    throw Error("tiering allocate: NVMe blocks have no address; write a pinned copy and evict it to nvme");
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "allocate");
  impl_->touch(t);
  PoolBlock& b = t.block[int(tier)];
  if (!b) {
    Busy busy(t);
    b = impl_->place(tier, t.desc.bytes, t.desc.kind, id, t.desc.name);
  }
  return b.ptr;
}

void TierManager::mark_written(TensorId id, Tier tier) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "mark_written");
  STRATA_CHECK(t.block[int(tier)], "tiering mark_written: \"", t.desc.name, "\" has no block on the ",
               to_string(tier), " tier (allocate it first)");
  t.valid = bit(tier);
  t.lost.clear();
  impl_->touch(t);
}

void* TierManager::data(TensorId id, Tier tier) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_completions();
  return impl_->get(id, "data").block[int(tier)].ptr;
}

Move TierManager::fetch(TensorId id, Tier to, const Event* after) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "fetch");
  impl_->touch(t);
  if (has(t.valid, to)) return Move();
  if (t.valid == 0)
    throw Error(
        cat("tiering fetch: \"", t.desc.name, "\" has no valid copy to fetch from ",
            t.lost.empty() ? "(never written: allocate() and mark_written() it first)" : "(" + t.lost + ")"));
  // The pinned copy is the hub (in place for either neighbour); else the only other tier holding one.
  Tier from = has(t.valid, Tier::pinned)   ? Tier::pinned
              : has(t.valid, Tier::device) ? Tier::device
                                           : Tier::nvme;
  return impl_->issue(t, from, to, /*drop_source=*/false, after);
}

Move TierManager::evict(TensorId id, Tier from, Tier to, const Event* after) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "evict");
  STRATA_CHECK(from != to, "tiering evict: \"", t.desc.name, "\" from ", to_string(from), " to itself");
  impl_->touch(t);
  if (!t.block[int(from)]) return Move();  // nothing there
  if (has(t.valid, to) || !has(t.valid, from)) {
    impl_->release(t, from, impl_->fence_after(after));
    return Move();
  }
  return impl_->issue(t, from, to, /*drop_source=*/true, after);
}

void TierManager::discard(TensorId id, Tier tier, const Event* after) {
  std::unique_lock<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->settle(lk, id, "discard");
  STRATA_CHECK(t.pins == 0, "tiering discard: \"", t.desc.name, "\" is pinned (unpin it first)");
  impl_->touch(t);
  impl_->release(t, tier, impl_->fence_after(after));
  if (t.valid == 0) t.lost = "discarded";
}

void TierManager::pin(TensorId id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->get(id, "pin");
  ++t.pins;
  impl_->touch(t);
}

void TierManager::unpin(TensorId id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  Tensor& t = impl_->get(id, "unpin");
  STRATA_CHECK(t.pins > 0, "tiering unpin: \"", t.desc.name, "\" is not pinned");
  --t.pins;
}

void TierManager::touch(TensorId id) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->touch(impl_->get(id, "touch"));
}

void TierManager::synchronize() {
  std::unique_lock<std::mutex> lk(impl_->mu);
  for (;;) {
    impl_->process_completions();
    std::vector<std::shared_ptr<detail::MoveJob>> flights;
    for (auto& [id, t] : impl_->tensors)
      if (t.flight) flights.push_back(t.flight);
    if (flights.empty()) return;
    lk.unlock();
    for (auto& j : flights) j->done.wait();
    lk.lock();
  }
}

void TierManager::set_step(std::int64_t step, Phase phase) {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->step = step;
  impl_->phase = phase;
  impl_->record(EventType::marker, Tier::device, Tier::device, Kind::param, 0, 0);
}

Usage TierManager::usage() const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_completions();
  Usage u;
  u.t_ns = impl_->now();
  u.step = impl_->step;
  u.phase = impl_->phase;
  u.last_seq = impl_->ring.last_seq();
  for (int t = 0; t < kTierCount; ++t) {
    for (int k = 0; k < kKindCount; ++k) u.bytes[t][k] = impl_->acct.bytes[t][k].current;
    if (!impl_->pools[t]) continue;
    PoolStats s = impl_->pools[t]->stats();
    u.present[t] = true;
    u.reserved[t] = s.reserved.current;
    u.capacity[t] = s.capacity;
  }
  return u;
}

std::vector<MemEvent> TierManager::events_since(std::uint64_t after_seq, std::uint64_t* dropped) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_completions();
  return impl_->ring.since(after_seq, dropped);
}

Snapshot TierManager::snapshot(bool with_events) const {
  std::lock_guard<std::mutex> lk(impl_->mu);
  impl_->process_completions();
  Snapshot s;
  s.t_ns = impl_->now();
  s.step = impl_->step;
  s.phase = impl_->phase;
  s.backend = to_string(impl_->dev.caps().backend);
  for (int t = 0; t < kTierCount; ++t) s.tiers[t] = impl_->tier_snapshot(Tier(t));
  s.moves = impl_->acct.moves;
  s.evictions = impl_->acct.evictions;
  s.evicted_bytes = impl_->acct.evicted_bytes;
  s.ooms = impl_->acct.ooms;
  s.failed_moves = impl_->acct.failed_moves;
  for (auto& [id, t] : impl_->tensors) {
    TensorSnapshot ts;
    ts.id = id;
    ts.name = t.desc.name;
    ts.kind = t.desc.kind;
    ts.dtype = t.desc.dtype;
    ts.bytes = t.desc.bytes;
    ts.home = t.desc.home;
    ts.chunk = t.desc.chunk;
    ts.shard = t.desc.shard;
    ts.valid = t.valid;
    for (int tier = 0; tier < kTierCount; ++tier)
      if (t.block[tier]) ts.allocated |= bit(Tier(tier));
    ts.state = impl_->state_of(t);
    ts.pins = t.pins;
    s.tensors.push_back(std::move(ts));
  }
  std::sort(s.tensors.begin(), s.tensors.end(), [](const auto& a, const auto& b) { return a.id < b.id; });
  if (with_events) s.events = impl_->ring.since(0, &s.events_dropped);
  return s;
}

PoolStats TierManager::pool_stats(Tier t) const {
  const TierPool* p = impl_->pools[int(t)].get();
  return p ? p->stats() : PoolStats{};
}

bool TierManager::has_tier(Tier t) const {
  return impl_->pools[int(t)] != nullptr;
}

const Device& TierManager::device() const {
  return impl_->dev;
}

}  // namespace strata::tiering
