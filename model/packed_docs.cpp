#include "model/packed_docs.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "core/error.h"
#include "model/token_file.h"

namespace strata::model {

using detail::cat;

namespace {

// The whole file at `path` (the sidecar is 8 bytes a document: small beside its token file).
std::vector<unsigned char> read_all(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  STRATA_SYS_CHECK(fd >= 0, "open document boundaries ", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    detail::throw_sys(__FILE__, __LINE__, "fstat", err, "document boundaries " + path);
  }
  std::vector<unsigned char> bytes(std::size_t(st.st_size));
  std::size_t got = 0;
  while (got < bytes.size()) {
    const ssize_t r = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) {
      const int err = r < 0 ? errno : EIO;
      ::close(fd);
      detail::throw_sys(__FILE__, __LINE__, "read", err, "document boundaries " + path);
    }
    got += std::size_t(r);
  }
  ::close(fd);
  return bytes;
}

std::uint64_t u64_at(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];  // little-endian whatever the host
  return v;
}

std::uint64_t header_u64(const unsigned char* header, int lo_int) {
  return u64_at(header + 4 * lo_int);  // ints lo_int (low 32 bits) and lo_int + 1 (high), little-endian
}

std::int32_t header_i32(const unsigned char* header, int i) {
  std::uint32_t v = 0;
  for (int b = 3; b >= 0; --b) v = (v << 8) | header[4 * i + b];
  return std::int32_t(v);
}

}  // namespace

std::string docs_path(const std::string& token_path) {
  return token_path + ".docs";
}

PackedDocs PackedDocs::open(const std::string& path, const std::string& token_path, std::size_t token_count) {
  PackedDocs d;
  d.path_ = path;
  d.tokens_ = token_count;
  const std::vector<unsigned char> bytes = read_all(path);
  const std::size_t header_bytes = kDocsHeaderInts * 4;
  const bool whole_header = bytes.size() >= header_bytes;
  const std::uint64_t said = whole_header ? header_u64(bytes.data(), 2) : 0;
  // Every refusal names both files, both counts and what to do.
  auto refuse = [&](const std::string& what) {
    throw ConfigError(
        cat("document boundaries ", path, " (header: ", said, " tokens) do not go with token file ",
            token_path, " (", token_count, " tokens): ", what,
            ". Re-run scripts/tokenize_text.py to write the token file and its sidecars together, "
            "or remove ",
            path, " to train with documents attending to each other"));
  };
  if (!whole_header)
    refuse(cat("its ", bytes.size(), " bytes are shorter than the ", header_bytes, "-byte header"));
  if (const std::int32_t magic = header_i32(bytes.data(), 0); magic != kDocsMagic)
    refuse(cat("magic ", magic, " is not a document-boundaries file's (", kDocsMagic, ")"));
  if (const std::int32_t version = header_i32(bytes.data(), 1); version != kDocsVersion)
    refuse(cat("version ", version, " is not one this build reads (", kDocsVersion, ")"));
  if (said != token_count) refuse("its token count differs");
  const std::uint64_t docs = header_u64(bytes.data(), 4);
  const std::size_t body = bytes.size() - header_bytes;
  if (body % 8 != 0 || body / 8 != docs)
    refuse(cat("its header says ", docs, " documents, but ", body, " bytes follow it, not 8 a document"));
  if (docs == 0) refuse("it holds no document; the first starts at token 0");
  d.starts_.resize(std::size_t(docs));
  std::uint64_t h = 0xcbf29ce484222325ull;
  for (std::size_t i = 0; i < d.starts_.size(); ++i) {
    const std::uint64_t s = u64_at(bytes.data() + header_bytes + 8 * i);
    if (i == 0 && s != 0) refuse(cat("document 0 starts at token ", s, "; the first must start at token 0"));
    if (i > 0 && s <= d.starts_[i - 1])
      refuse(cat("document ", i, " starts at token ", s, ", not after document ", i - 1, "'s start ",
                 d.starts_[i - 1], "; the starts must increase"));
    if (s >= token_count)
      refuse(cat("document ", i, " starts at token ", s, ", past the file's last token ", token_count - 1));
    d.starts_[i] = s;
    for (int b = 0; b < 8; ++b) h = (h ^ ((s >> (8 * b)) & 0xFF)) * 0x100000001b3ull;
  }
  d.digest_ = h != 0 ? h : 1;
  return d;
}

bool PackedDocs::starts_at(std::uint64_t i) const {
  return std::binary_search(starts_.begin(), starts_.end(), i);
}

void PackedDocs::positions(std::uint64_t begin, std::size_t n, std::int32_t* pos) const {
  STRATA_CHECK(begin <= tokens_ && n <= tokens_ - begin, "tokens [", begin, ", ", begin + n,
               ") are outside document boundaries ", path_, " (", tokens_, " tokens)");
  // The first document start after `begin`, then walk.
  auto next = std::upper_bound(starts_.begin(), starts_.end(), begin);
  std::uint64_t from = begin;  // the current document's first token within the row
  for (std::size_t j = 0; j < n; ++j) {
    const std::uint64_t i = begin + j;
    if (next != starts_.end() && *next == i) {
      from = i;
      ++next;
    }
    pos[j] = std::int32_t(i - from);
  }
}

std::size_t PackedDocs::count(std::uint64_t begin, std::size_t n) const {
  return std::size_t(std::lower_bound(starts_.begin(), starts_.end(), begin + n) -
                     std::lower_bound(starts_.begin(), starts_.end(), begin));
}

void check_document_positions(const std::int32_t* positions, int B, int T, const char* who) {
  for (int b = 0; b < B; ++b)
    for (int t = 0; t < T; ++t) {
      const std::int32_t p = positions[std::size_t(b) * std::size_t(T) + std::size_t(t)];
      const std::int32_t before =
          t > 0 ? positions[std::size_t(b) * std::size_t(T) + std::size_t(t) - 1] : -1;
      if (p < 0 || p >= T || (t > 0 && p != 0 && p != before + 1))
        throw ConfigError(cat(who, ": position_ids[", b, ", ", t, "] is ", p,
                              t > 0 ? cat(" after ", before) : std::string(),
                              "; packed documents' positions are 0 where a document starts and one more than "
                              "the one before within it, each in [0, ",
                              T, ") (transformers' DataCollatorWithFlattening)"));
    }
}

void write_docs_file(const std::string& path, std::span<const std::uint64_t> starts,
                     std::uint64_t token_count) {
  for (std::size_t i = 0; i < starts.size(); ++i)
    if ((i == 0 && starts[i] != 0) || (i > 0 && starts[i] <= starts[i - 1]) || starts[i] >= token_count)
      throw ConfigError(cat("document boundaries ", path, ": start ", i, " is ", starts[i],
                            "; the starts must begin at 0, increase, and stay below the ", token_count,
                            " tokens"));
  std::vector<unsigned char> buf(kDocsHeaderInts * 4 + 8 * starts.size(), 0);
  auto put = [&](std::size_t at, std::uint64_t v, int bytes) {
    for (int b = 0; b < bytes; ++b) buf[at + std::size_t(b)] = static_cast<unsigned char>(v >> (8 * b));
  };
  put(0, std::uint32_t(kDocsMagic), 4);
  put(4, std::uint32_t(kDocsVersion), 4);
  put(8, token_count, 8);
  put(16, starts.size(), 8);
  for (std::size_t i = 0; i < starts.size(); ++i) put(kDocsHeaderInts * 4 + 8 * i, starts[i], 8);
  write_file_replacing(path, buf);
}

}  // namespace strata::model
