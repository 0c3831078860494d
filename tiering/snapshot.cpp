#include "tiering/snapshot.h"

#include <type_traits>

#include <string>

#include "core/error.h"

namespace strata::tiering {
namespace {

using nlohmann::json;

// j[field] as T; a missing field or one of the wrong type raises ConfigError naming it.
template <typename T>
T get(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end())
    throw ConfigError(
        strata::detail::cat("memprof JSON: field \"", field, "\" is missing in ", j.dump().substr(0, 120)));
  if constexpr (std::is_integral_v<T> && !std::is_same_v<T, bool>)
    return json_whole<T>(*it, strata::detail::cat("field \"", field, "\""));
  try {
    return it->get<T>();
  } catch (const json::exception& e) {
    throw ConfigError(strata::detail::cat("memprof JSON: field \"", field, "\" has the wrong type (",
                                          it->dump(), "): ", e.what()));
  }
}

const json& obj(const json& j, const char* field) {
  auto it = j.find(field);
  if (it == j.end() || !(it->is_object() || it->is_array()))
    throw ConfigError(strata::detail::cat("memprof JSON: field \"", field, "\" is missing or not an object"));
  return *it;
}

constexpr std::array<const char*, kStatTypes> kStatTypeNames = {"aggregate", "small_pool", "large_pool"};

json to_json(const StatArray& a) {
  json j = json::object();
  for (int i = 0; i < kStatTypes; ++i) j[kStatTypeNames[i]] = to_json(a[i]);
  return j;
}
StatArray stat_array(const json& j, const char* field) {
  const json& o = obj(j, field);
  StatArray a;
  for (int i = 0; i < kStatTypes; ++i) a[i] = stat_from_json(obj(o, kStatTypeNames[i]), kStatTypeNames[i]);
  return a;
}

json tier_json(const TierSnapshot& t) {
  json j = {{"present", t.present},   {"capacity", t.capacity}, {"used", t.used},
            {"reserved", t.reserved}, {"free", t.free},         {"pending", t.pending},
            {"retries", t.retries},   {"ooms", t.ooms},         {"total", to_json(t.total)}};
  json k = json::object();
  for (int i = 0; i < kKindCount; ++i) k[to_string(Kind(i))] = to_json(t.by_kind[i]);
  j["by_kind"] = k;
  if (t.has_allocator) j["allocator"] = to_json(t.allocator);
  return j;
}

TierSnapshot tier_from_json(const json& j) {
  TierSnapshot t;
  t.present = get<bool>(j, "present");
  t.capacity = get<std::uint64_t>(j, "capacity");
  t.used = get<std::uint64_t>(j, "used");
  t.reserved = get<std::uint64_t>(j, "reserved");
  t.free = get<std::uint64_t>(j, "free");
  t.pending = get<std::uint64_t>(j, "pending");
  t.retries = get<std::uint64_t>(j, "retries");
  t.ooms = get<std::uint64_t>(j, "ooms");
  t.total = stat_from_json(obj(j, "total"), "total");
  const json& k = obj(j, "by_kind");
  for (int i = 0; i < kKindCount; ++i)
    t.by_kind[i] = stat_from_json(obj(k, to_string(Kind(i))), to_string(Kind(i)));
  if (j.contains("allocator")) {
    t.has_allocator = true;
    t.allocator = allocator_stats_from_json(obj(j, "allocator"));
  }
  return t;
}

json tensor_json(const TensorSnapshot& t) {
  return {{"id", t.id},
          {"name", t.name},
          {"kind", to_string(t.kind)},
          {"dtype", dtype_name(t.dtype)},
          {"bytes", t.bytes},
          {"home", to_string(t.home)},
          {"chunk", t.chunk},
          {"shard", t.shard},
          {"valid", tier_mask_string(t.valid)},
          {"allocated", tier_mask_string(t.allocated)},
          {"state", to_string(t.state)},
          {"pins", t.pins}};
}

TensorSnapshot tensor_from_json(const json& j) {
  TensorSnapshot t;
  t.id = get<TensorId>(j, "id");
  t.name = get<std::string>(j, "name");
  t.kind = parse_kind(get<std::string>(j, "kind"), "tensors[].kind");
  t.dtype = parse_dtype(get<std::string>(j, "dtype"), "tensors[].dtype");
  t.bytes = get<std::uint64_t>(j, "bytes");
  t.home = parse_tier(get<std::string>(j, "home"), "tensors[].home");
  t.chunk = get<std::int32_t>(j, "chunk");
  t.shard = get<std::int32_t>(j, "shard");
  t.valid = parse_tier_mask(get<std::string>(j, "valid"));
  t.allocated = parse_tier_mask(get<std::string>(j, "allocated"));
  t.state = parse_state(get<std::string>(j, "state"), "tensors[].state");
  t.pins = get<std::int32_t>(j, "pins");
  return t;
}

}  // namespace

json to_json(const Stat& s) {
  return {{"current", s.current}, {"peak", s.peak}, {"allocated", s.allocated}, {"freed", s.freed}};
}

Stat stat_from_json(const json& j, const char* field) {
  if (!j.is_object())
    throw ConfigError(strata::detail::cat("memprof JSON: stat \"", field, "\" is not an object"));
  Stat s;
  s.current = get<std::uint64_t>(j, "current");
  s.peak = get<std::uint64_t>(j, "peak");
  s.allocated = get<std::uint64_t>(j, "allocated");
  s.freed = get<std::uint64_t>(j, "freed");
  return s;
}

json to_json(const MemEvent& e) {
  return {{"seq", e.seq},
          {"t", e.t_ns},
          {"ev", to_string(e.type)},
          {"tier", to_string(e.tier)},
          {"to", to_string(e.to)},
          {"kind", to_string(e.kind)},
          {"phase", to_string(e.phase)},
          {"tensor", e.tensor},
          {"bytes", e.bytes},
          {"step", e.step}};
}

MemEvent event_from_json(const json& j) {
  MemEvent e;
  e.seq = get<std::uint64_t>(j, "seq");
  e.t_ns = get<std::int64_t>(j, "t");
  e.type = parse_event_type(get<std::string>(j, "ev").c_str());
  e.tier = parse_tier(get<std::string>(j, "tier"), "events[].tier");
  e.to = parse_tier(get<std::string>(j, "to"), "events[].to");
  e.kind = parse_kind(get<std::string>(j, "kind"), "events[].kind");
  e.phase = parse_phase(get<std::string>(j, "phase"), "events[].phase");
  e.tensor = get<TensorId>(j, "tensor");
  e.bytes = get<std::uint64_t>(j, "bytes");
  e.step = get<std::int64_t>(j, "step");
  return e;
}

json to_json(const AllocatorStats& a) {
  return {{"capacity", a.capacity},
          {"num_alloc_retries", a.num_alloc_retries},
          {"num_ooms", a.num_ooms},
          {"allocation", to_json(a.allocation)},
          {"segment", to_json(a.segment)},
          {"active", to_json(a.active)},
          {"allocated_bytes", to_json(a.allocated_bytes)},
          {"requested_bytes", to_json(a.requested_bytes)},
          {"reserved_bytes", to_json(a.reserved_bytes)},
          {"pending_bytes", to_json(a.pending_bytes)}};
}

AllocatorStats allocator_stats_from_json(const json& j) {
  AllocatorStats a;
  a.capacity = get<std::uint64_t>(j, "capacity");
  a.num_alloc_retries = get<std::uint64_t>(j, "num_alloc_retries");
  a.num_ooms = get<std::uint64_t>(j, "num_ooms");
  a.allocation = stat_array(j, "allocation");
  a.segment = stat_array(j, "segment");
  a.active = stat_array(j, "active");
  a.allocated_bytes = stat_array(j, "allocated_bytes");
  a.requested_bytes = stat_array(j, "requested_bytes");
  a.reserved_bytes = stat_array(j, "reserved_bytes");
  a.pending_bytes = stat_array(j, "pending_bytes");
  return a;
}

std::string tier_mask_string(TierMask m) {
  std::string s;
  for (int t = 0; t < kTierCount; ++t)
    if (has(m, Tier(t))) s += std::string(s.empty() ? "" : ",") + to_string(Tier(t));
  return s;
}

TierMask parse_tier_mask(const std::string& s) {
  TierMask m = 0;
  std::size_t at = 0;
  while (at < s.size()) {
    std::size_t comma = s.find(',', at);
    if (comma == std::string::npos) comma = s.size();
    m |= bit(parse_tier(std::string_view(s).substr(at, comma - at), "tier list"));
    at = comma + 1;
  }
  return m;
}

json Snapshot::to_json() const {
  json j = {{"schema", kSchema}, {"version", kSchemaVersion}, {"type", "snapshot"}, {"t_ns", t_ns},
            {"step", step},      {"phase", to_string(phase)}, {"backend", backend}};
  json tj = json::object();
  for (int t = 0; t < kTierCount; ++t) tj[to_string(Tier(t))] = tier_json(tiers[t]);
  j["tiers"] = tj;
  json mj = json::object();
  for (int d = 0; d < kDirectionCount; ++d)
    mj[direction_name(d)] = {{"count", moves[d].count}, {"bytes", moves[d].bytes}};
  j["moves"] = mj;
  j["evictions"] = evictions;
  j["evicted_bytes"] = evicted_bytes;
  j["ooms"] = ooms;
  j["failed_moves"] = failed_moves;
  json ts = json::array();
  for (const TensorSnapshot& t : tensors) ts.push_back(tensor_json(t));
  j["tensors"] = ts;
  json es = json::array();
  for (const MemEvent& e : events) es.push_back(tiering::to_json(e));
  j["events"] = es;
  j["events_dropped"] = events_dropped;
  return j;
}

Snapshot Snapshot::from_json(const json& j) {
  if (!j.is_object()) throw ConfigError("memprof JSON: a snapshot must be an object");
  std::string schema = get<std::string>(j, "schema");
  if (schema != kSchema)
    throw ConfigError(strata::detail::cat("memprof JSON: schema \"", schema, "\" is not \"", kSchema, "\""));
  int version = get<int>(j, "version");
  if (version < 1 || version > kSchemaVersion)
    throw ConfigError(strata::detail::cat("memprof JSON: version ", version,
                                          " is not supported (this build reads 1..", kSchemaVersion,
                                          "); use a newer memprof"));
  Snapshot s;
  s.t_ns = get<std::int64_t>(j, "t_ns");
  s.step = get<std::int64_t>(j, "step");
  s.phase = parse_phase(get<std::string>(j, "phase"), "phase");
  s.backend = get<std::string>(j, "backend");
  const json& tj = obj(j, "tiers");
  for (int t = 0; t < kTierCount; ++t) s.tiers[t] = tier_from_json(obj(tj, to_string(Tier(t))));
  const json& mj = obj(j, "moves");
  for (int d = 0; d < kDirectionCount; ++d) {
    const json& m = obj(mj, direction_name(d));
    s.moves[d].count = get<std::uint64_t>(m, "count");
    s.moves[d].bytes = get<std::uint64_t>(m, "bytes");
  }
  s.evictions = get<std::uint64_t>(j, "evictions");
  s.evicted_bytes = get<std::uint64_t>(j, "evicted_bytes");
  s.ooms = get<std::uint64_t>(j, "ooms");
  s.failed_moves = get<std::uint64_t>(j, "failed_moves");
  for (const json& t : obj(j, "tensors")) s.tensors.push_back(tensor_from_json(t));
  for (const json& e : obj(j, "events")) s.events.push_back(event_from_json(e));
  s.events_dropped = get<std::uint64_t>(j, "events_dropped");
  return s;
}

}  // namespace strata::tiering
