#include "tiering/accounting.h"

#include <array>
#include <cstring>
#include <string>

#include "core/error.h"

namespace strata::tiering {
namespace {

constexpr std::array<const char*, kEventTypeCount> kEventNames = {
    "alloc", "free", "move_issued", "move_done",    "move_failed",
    "evict", "oom",  "marker",      "tensor_added", "tensor_removed"};

struct Dir {
  Tier from, to;
  const char* name;
};
constexpr std::array<Dir, kDirectionCount> kDirs = {{
    {Tier::device, Tier::pinned, "device_to_pinned"},
    {Tier::pinned, Tier::device, "pinned_to_device"},
    {Tier::pinned, Tier::nvme, "pinned_to_nvme"},
    {Tier::nvme, Tier::pinned, "nvme_to_pinned"},
    {Tier::device, Tier::nvme, "device_to_nvme"},
    {Tier::nvme, Tier::device, "nvme_to_device"},
}};

}  // namespace

const char* to_string(EventType t) {
  return kEventNames[std::size_t(t)];
}

EventType parse_event_type(const char* name) {
  for (std::size_t i = 0; i < kEventNames.size(); ++i)
    if (std::strcmp(name, kEventNames[i]) == 0) return EventType(i);
  std::string allowed;
  for (std::size_t i = 0; i < kEventNames.size(); ++i) allowed += std::string(i ? ", " : "") + kEventNames[i];
  throw ConfigError(strata::detail::cat("event type \"", name, "\" is not one of ", allowed));
}

int direction(Tier from, Tier to) {
  for (int d = 0; d < kDirectionCount; ++d)
    if (kDirs[d].from == from && kDirs[d].to == to) return d;
  throw Error(strata::detail::cat("no move direction from ", to_string(from), " to ", to_string(to)));
}
Tier direction_from(int d) {
  return kDirs[std::size_t(d)].from;
}
Tier direction_to(int d) {
  return kDirs[std::size_t(d)].to;
}
const char* direction_name(int d) {
  return kDirs[std::size_t(d)].name;
}

EventRing::EventRing(std::size_t capacity) : buf_(capacity ? capacity : 1) {}

std::uint64_t EventRing::push(MemEvent e) {
  e.seq = next_++;
  buf_[e.seq % buf_.size()] = e;
  return e.seq;
}

std::vector<MemEvent> EventRing::since(std::uint64_t after, std::uint64_t* dropped) const {
  std::uint64_t last = next_ - 1;
  std::uint64_t oldest = last >= buf_.size() ? last - buf_.size() + 1 : 1;
  std::uint64_t first = std::max(after + 1, oldest);
  if (dropped) *dropped = first > after + 1 ? first - (after + 1) : 0;
  std::vector<MemEvent> out;
  if (first > last) return out;
  out.reserve(last - first + 1);
  for (std::uint64_t s = first; s <= last; ++s) out.push_back(buf_[s % buf_.size()]);
  return out;
}

}  // namespace strata::tiering
