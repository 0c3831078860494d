#include "model/loss_mask.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <vector>

#include "core/error.h"
#include "model/token_file.h"

namespace strata::model {

using detail::cat;

std::string mask_path(const std::string& token_path) {
  return token_path + ".mask";
}

LossMask LossMask::open(const std::string& path, const std::string& token_path, std::size_t token_count) {
  LossMask m;
  m.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_SYS_CHECK(fd >= 0, "open loss mask ", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    detail::throw_sys(__FILE__, __LINE__, "fstat", err, "loss mask " + path);
  }
  m.map_bytes_ = std::size_t(st.st_size);
  if (m.map_bytes_ > 0) {
    m.map_ = ::mmap(nullptr, m.map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    ::close(fd);
    if (m.map_ == MAP_FAILED) {
      m.map_ = nullptr;
      detail::throw_sys(__FILE__, __LINE__, "mmap", err, "loss mask " + path);
    }
  } else {
    ::close(fd);
  }
  const auto* bytes = static_cast<const std::uint8_t*>(m.map_);
  const std::size_t header_bytes = kMaskHeaderInts * 4;
  std::int32_t head[4] = {0, 0, 0, 0};
  if (m.map_bytes_ >= sizeof(head)) std::memcpy(head, bytes, sizeof(head));
  const std::uint64_t said =
      std::uint64_t(std::uint32_t(head[2])) | (std::uint64_t(std::uint32_t(head[3])) << 32);
  // Every refusal names both files, both counts and what to do.
  auto refuse = [&](const std::string& what) {
    throw ConfigError(cat("loss mask ", path, " (header: ", said, " tokens) does not go with token file ",
                          token_path, " (", token_count, " tokens): ", what,
                          ". Re-run scripts/tokenize_text.py to write the token file and its mask together, "
                          "or remove ",
                          path, " to train on every token"));
  };
  if (m.map_bytes_ < header_bytes)
    refuse(cat("its ", m.map_bytes_, " bytes are shorter than the ", header_bytes, "-byte header"));
  if (head[0] != kMaskMagic) refuse(cat("magic ", head[0], " is not a loss mask's (", kMaskMagic, ")"));
  if (head[1] != kMaskVersion)
    refuse(cat("version ", head[1], " is not one this build reads (", kMaskVersion, ")"));
  if (said != token_count) refuse("its token count differs");
  if (m.map_bytes_ - header_bytes != token_count)
    refuse(cat("it holds ", m.map_bytes_ - header_bytes, " mask bytes after its header, not one per token"));
  m.bytes_ = bytes + header_bytes;
  m.count_ = token_count;
  // One pass: every byte 0 or 1, the ones counted, the digest taken.
  std::uint64_t h = 0xcbf29ce484222325ull;
  std::size_t ones = 0;
  for (std::size_t i = 0; i < m.count_; ++i) {
    const std::uint8_t b = m.bytes_[i];
    if (b > 1) refuse(cat("byte ", i, " (token ", i, ") is ", int(b), "; each must be 0 or 1"));
    ones += b;
    h = (h ^ b) * 0x100000001b3ull;
  }
  m.counted_ = ones;
  m.digest_ = h != 0 ? h : 1;
  return m;
}

LossMask::LossMask(LossMask&& o) noexcept {
  *this = std::move(o);
}

LossMask& LossMask::operator=(LossMask&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    bytes_ = o.bytes_;
    count_ = o.count_;
    counted_ = o.counted_;
    digest_ = o.digest_;
    o.map_ = nullptr;
    o.bytes_ = nullptr;
    o.count_ = o.counted_ = 0;
  }
  return *this;
}

LossMask::~LossMask() {
  if (map_) ::munmap(map_, map_bytes_);
}

bool LossMask::counts(std::size_t i) const {
  STRATA_CHECK(i < count_, "token ", i, " is past the end of loss mask ", path_, " (", count_, " tokens)");
  return bytes_[i] != 0;
}

std::size_t LossMask::count(std::size_t begin, std::size_t n) const {
  STRATA_CHECK(begin <= count_ && n <= count_ - begin, "tokens [", begin, ", ", begin + n,
               ") are outside loss mask ", path_, " (", count_, " tokens)");
  std::size_t ones = 0;
  for (std::size_t i = begin; i < begin + n; ++i) ones += bytes_[i];
  return ones;
}

void write_mask_file(const std::string& path, std::span<const std::uint8_t> mask) {
  std::vector<std::uint8_t> buf(kMaskHeaderInts * 4 + mask.size());
  std::vector<std::int32_t> header(kMaskHeaderInts, 0);
  header[0] = kMaskMagic;
  header[1] = kMaskVersion;
  const std::uint64_t n = mask.size();
  header[2] = std::int32_t(std::uint32_t(n & 0xFFFFFFFFu));
  header[3] = std::int32_t(std::uint32_t(n >> 32));
  std::memcpy(buf.data(), header.data(), header.size() * 4);
  for (std::size_t i = 0; i < mask.size(); ++i) {
    if (mask[i] > 1)
      throw ConfigError(cat("loss mask ", path, ": byte ", i, " is ", int(mask[i]), "; each must be 0 or 1"));
    buf[kMaskHeaderInts * 4 + i] = mask[i];
  }
  write_file_replacing(path, buf);
}

}  // namespace strata::model
