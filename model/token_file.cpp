#include "model/token_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <vector>

#include "core/error.h"

namespace strata::model {
namespace {

size_t token_bytes(TokenType t) {
  return t == TokenType::u16 ? 2 : 4;
}

void write_all(int fd, const void* data, size_t n, const std::string& path) {
  const char* p = static_cast<const char*>(data);
  while (n > 0) {
    ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    STRATA_SYS_CHECK(w > 0, "write ", n, " bytes to ", path);
    p += w;
    n -= size_t(w);
  }
}

}  // namespace

TokenFile TokenFile::open(const std::string& path, TokenType flat_type) {
  TokenFile f;
  f.path_ = path;
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_SYS_CHECK(fd >= 0, "open token file ", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    detail::throw_sys(__FILE__, __LINE__, "fstat", err, "token file " + path);
  }
  f.map_bytes_ = size_t(st.st_size);
  if (f.map_bytes_ == 0) {
    ::close(fd);
    throw ConfigError(detail::cat("token file ", path, " is empty; make one with the byte tokenizer"));
  }
  f.map_ = ::mmap(nullptr, f.map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (f.map_ == MAP_FAILED) {
    f.map_ = nullptr;
    detail::throw_sys(__FILE__, __LINE__, "mmap", err, "token file " + path);
  }
  const auto* bytes = static_cast<const unsigned char*>(f.map_);

  int32_t head[3] = {0, 0, 0};
  if (f.map_bytes_ >= sizeof(head)) std::memcpy(head, bytes, sizeof(head));
  if (head[0] == kLlmcMagicU16 || head[0] == kLlmcMagicU32) {
    const size_t header_bytes = kLlmcHeaderInts * 4;
    bool u16 = head[0] == kLlmcMagicU16;
    int32_t want_version = u16 ? kLlmcVersionU16 : kLlmcVersionU32;
    if (head[1] != want_version)
      throw ConfigError(detail::cat("token file ", path, ": llm.c magic ", head[0], " with version ", head[1],
                                    "; only version ", want_version, " is known for that magic"));
    if (f.map_bytes_ < header_bytes)
      throw ConfigError(detail::cat("token file ", path, ": ", f.map_bytes_,
                                    " bytes is shorter than llm.c's 1024-byte header"));
    f.header_ = true;
    f.type_ = u16 ? TokenType::u16 : TokenType::u32;
    size_t have = (f.map_bytes_ - header_bytes) / token_bytes(f.type_);
    if (head[2] < 0 || size_t(head[2]) != have || (f.map_bytes_ - header_bytes) % token_bytes(f.type_) != 0)
      throw ConfigError(detail::cat("token file ", path, ": header says ", head[2],
                                    " tokens, the file holds ", f.map_bytes_ - header_bytes, " bytes of ",
                                    token_bytes(f.type_),
                                    "-byte tokens; the file is truncated or not an llm.c .bin"));
    f.tokens_ = bytes + header_bytes;
    f.count_ = have;
  } else {
    f.type_ = flat_type;
    if (f.map_bytes_ % token_bytes(flat_type) != 0)
      throw ConfigError(detail::cat("token file ", path, ": ", f.map_bytes_, " bytes is not a multiple of ",
                                    token_bytes(flat_type), "-byte tokens (no llm.c header found)"));
    f.tokens_ = bytes;
    f.count_ = f.map_bytes_ / token_bytes(flat_type);
  }
  if (f.count_ == 0) throw ConfigError(detail::cat("token file ", path, " holds no tokens"));
  const std::string mp = mask_path(path);
  std::error_code ec;
  if (std::filesystem::exists(mp, ec)) f.mask_.emplace(LossMask::open(mp, path, f.count_));
  const std::string dp = docs_path(path);
  if (std::filesystem::exists(dp, ec)) f.docs_.emplace(PackedDocs::open(dp, path, f.count_));
  return f;
}

TokenFile::TokenFile(TokenFile&& o) noexcept {
  *this = std::move(o);
}

TokenFile& TokenFile::operator=(TokenFile&& o) noexcept {
  if (this != &o) {
    if (map_) ::munmap(map_, map_bytes_);
    path_ = std::move(o.path_);
    map_ = o.map_;
    map_bytes_ = o.map_bytes_;
    tokens_ = o.tokens_;
    count_ = o.count_;
    type_ = o.type_;
    header_ = o.header_;
    mask_ = std::move(o.mask_);
    o.mask_.reset();
    docs_ = std::move(o.docs_);
    o.docs_.reset();
    o.map_ = nullptr;
    o.tokens_ = nullptr;
    o.count_ = 0;
  }
  return *this;
}

TokenFile::~TokenFile() {
  if (map_) ::munmap(map_, map_bytes_);
}

TokenFile::Scan TokenFile::scan(uint64_t limit) const {
  Scan s{.first_at_or_above = count_, .digest = 0xcbf29ce484222325ull};
  auto walk = [&](auto token) {
    using T = decltype(token);
    for (size_t i = 0; i < count_; ++i) {
      T v;
      std::memcpy(&v, tokens_ + sizeof(T) * i, sizeof(T));
      if (v >= limit && s.first_at_or_above == count_) s.first_at_or_above = i;
      s.digest = (s.digest ^ uint64_t(v)) * 0x100000001b3ull;
    }
  };
  if (type_ == TokenType::u16)
    walk(uint16_t{});
  else
    walk(uint32_t{});
  return s;
}

uint32_t TokenFile::at(size_t i) const {
  STRATA_CHECK(i < count_, "token ", i, " is past the end of ", path_, " (", count_, " tokens)");
  if (type_ == TokenType::u16) {
    uint16_t v;
    std::memcpy(&v, tokens_ + 2 * i, 2);
    return v;
  }
  uint32_t v;
  std::memcpy(&v, tokens_ + 4 * i, 4);
  return v;
}

void TokenFile::read(size_t begin, size_t count, int32_t* dst) const {
  STRATA_CHECK(begin <= count_ && count <= count_ - begin, "tokens [", begin, ", ", begin + count,
               ") are outside ", path_, " (", count_, " tokens)");
  if (type_ == TokenType::u16) {
    for (size_t i = 0; i < count; ++i) {
      uint16_t v;
      std::memcpy(&v, tokens_ + 2 * (begin + i), 2);
      dst[i] = int32_t(v);
    }
  } else {
    for (size_t i = 0; i < count; ++i) {
      uint32_t v;
      std::memcpy(&v, tokens_ + 4 * (begin + i), 4);
      dst[i] = int32_t(v);
    }
  }
}

void write_token_file(const std::string& path, std::span<const uint32_t> tokens, TokenType type,
                      bool llmc_header) {
  if (llmc_header && tokens.size() > size_t(INT32_MAX))
    throw ConfigError(
        detail::cat("token file ", path, ": ", tokens.size(),
                    " tokens do not fit llm.c's int32 header count; write it without the header"));
  std::vector<unsigned char> buf;
  buf.reserve(tokens.size() * token_bytes(type) + (llmc_header ? kLlmcHeaderInts * 4 : 0));
  if (llmc_header) {
    std::vector<int32_t> header(kLlmcHeaderInts, 0);
    header[0] = type == TokenType::u16 ? kLlmcMagicU16 : kLlmcMagicU32;
    header[1] = type == TokenType::u16 ? kLlmcVersionU16 : kLlmcVersionU32;
    header[2] = int32_t(tokens.size());
    const auto* h = reinterpret_cast<const unsigned char*>(header.data());
    buf.insert(buf.end(), h, h + header.size() * 4);
  }
  for (size_t i = 0; i < tokens.size(); ++i) {
    uint32_t t = tokens[i];
    if (type == TokenType::u16) {
      if (t > 0xFFFF)
        throw ConfigError(detail::cat("token file ", path, ": token ", i, " is ", t,
                                      ", which does not fit uint16; write the file as u32"));
      uint16_t v = uint16_t(t);
      const auto* p = reinterpret_cast<const unsigned char*>(&v);
      buf.insert(buf.end(), p, p + 2);
    } else {
      const auto* p = reinterpret_cast<const unsigned char*>(&t);
      buf.insert(buf.end(), p, p + 4);
    }
  }
  write_file_replacing(path, std::span<const unsigned char>(buf.data(), buf.size()));
}

void write_file_replacing(const std::string& path, std::span<const unsigned char> bytes) {
  const std::string tmp = path + ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_SYS_CHECK(fd >= 0, "create ", tmp);
  try {
    write_all(fd, bytes.data(), bytes.size(), tmp);
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  STRATA_SYS_CHECK(::close(fd) == 0, "close ", tmp);
  STRATA_SYS_CHECK(::rename(tmp.c_str(), path.c_str()) == 0, "rename ", tmp, " to ", path);
}

}  // namespace strata::model
