#include "model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/log.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

// Hugging Face's reader refuses headers above 100 MB; so do we (a larger one is a corrupt file).
constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

std::string shape_str(std::span<const int64_t> s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? ", " : "") + std::to_string(s[i]);
  return out + "]";
}

std::string dir_of(const std::string& path) {
  size_t slash = path.rfind('/');
  return slash == std::string::npos ? std::string(".") : path.substr(0, slash);
}

bool ends_with(const std::string& s, std::string_view suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What a user can do about a failed create / write / rename in a directory they chose.
std::string write_hint(int err) {
  switch (err) {
    case ENOSPC:
    case EDQUOT:
      return "; free space on that file system or write elsewhere";
    case EACCES:
    case EPERM:
    case EROFS:
      return "; choose a directory this user can write";
    case ENOENT:
    case ENOTDIR:
      return "; the directory to write to must exist (and every parent must be a directory)";
    default:
      return "";
  }
}

// An IoError for a system call on a user's file: `what` names the operation and the path, then the errno
// text and `hint`. Not STRATA_SYS_CHECK: its file:line and statement are for programming errors.
[[noreturn]] void throw_io(const std::string& what, int err, std::string_view hint = {}) {
  throw IoError(detail::cat(what, ": ", detail::errno_text(err), hint));
}

// Every shard an index lists is there, before any is opened: a partial download (a shard missing) is the
// common case, and its error names every missing file, the index and what to do rather than the first
// file open() could not find.
void check_shards_exist(const std::string& index, const std::vector<std::string>& files,
                        const std::map<std::string, std::vector<std::string>>& tensors_of) {
  const std::string dir = dir_of(index);
  std::vector<std::string> missing;
  for (const std::string& f : files) {
    struct stat st;
    if (::stat((dir + "/" + f).c_str(), &st) != 0 && errno == ENOENT) missing.push_back(f);
  }
  if (missing.empty()) return;
  constexpr size_t kNamed = 4;  // files named in full; the rest are counted
  std::string list;
  for (size_t i = 0; i < std::min(missing.size(), kNamed); ++i) {
    const std::vector<std::string>& t = tensors_of.at(missing[i]);
    list += detail::cat(i ? ", " : "", dir, "/", missing[i], " (tensor '", t.front(), "'",
                        t.size() > 1 ? detail::cat(" and ", t.size() - 1, " more") : std::string(), ")");
  }
  if (missing.size() > kNamed) list += detail::cat(" and ", missing.size() - kNamed, " more");
  const std::string how_many =
      files.size() == 1 ? std::string("the one shard file it lists is")
                        : detail::cat(missing.size(), " of the ", files.size(), " shard files it lists ",
                                      missing.size() == 1 ? "is" : "are");
  throw ConfigError(detail::cat("safetensors index ", index, ": ", how_many, " missing: ", list,
                                "; the model directory is incomplete (an interrupted download?): download "
                                "the model again, or check that ",
                                dir, " is the directory the index came with"));
}

}  // namespace

size_t SafetensorsEntry::numel() const {
  size_t n = 1;
  for (int64_t d : shape) n *= size_t(d);
  return n;
}

SafetensorsReader::SafetensorsReader(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) {
    const int err = errno;
    throw_io("cannot open safetensors file " + path, err);
  }
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    int err = errno;
    ::close(fd);
    throw_io("cannot stat safetensors file " + path, err);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    throw ConfigError(detail::cat("safetensors file ", path, " is ",
                                  S_ISDIR(st.st_mode) ? "a directory" : "not a regular file",
                                  "; give a .safetensors file (or the model directory that holds it)"));
  }
  map_bytes_ = size_t(st.st_size);
  if (map_bytes_ < 8) {
    ::close(fd);
    throw ConfigError(detail::cat("safetensors file ", path, ": ", map_bytes_,
                                  " bytes is too short for the 8-byte header length"));
  }
  map_ = ::mmap(nullptr, map_bytes_, PROT_READ, MAP_PRIVATE, fd, 0);
  int err = errno;
  ::close(fd);
  if (map_ == MAP_FAILED) {
    map_ = nullptr;
    throw_io("cannot map safetensors file " + path, err);
  }
  try {
    const auto* bytes = static_cast<const unsigned char*>(map_);
    uint64_t n = 0;
    for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];
    if (n > kMaxHeaderBytes || n > map_bytes_ - 8)
      throw ConfigError(detail::cat("safetensors file ", path, ": header length ", n, " does not fit the ",
                                    map_bytes_, "-byte file; it is truncated or not a safetensors file"));
    json header;
    try {
      header = json::parse(bytes + 8, bytes + 8 + n);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
      throw ConfigError(detail::cat("safetensors file ", path, ": header is not valid JSON: ", e.what()));
    }
    if (!header.is_object())
      throw ConfigError(detail::cat("safetensors file ", path, ": header is not a JSON object"));
    data_ = bytes + 8 + n;
    const uint64_t data_bytes = map_bytes_ - 8 - n;
    for (const auto& item : header.items()) {
      // Not a structured binding: `bad` below captures the name, which clang < 16 cannot do for those.
      const std::string& name = item.key();
      const json& v = item.value();
      if (name == "__metadata__") {
        if (!v.is_object())
          throw ConfigError(detail::cat("safetensors file ", path, ": __metadata__ is not an object"));
        for (const auto& [k, s] : v.items()) metadata_[k] = s.is_string() ? s.get<std::string>() : s.dump();
        continue;
      }
      auto bad = [&](const std::string& why) {
        return ConfigError(detail::cat("safetensors file ", path, ": tensor '", name, "' ", why));
      };
      if (!v.is_object() || !v.contains("dtype") || !v.contains("shape") || !v.contains("data_offsets"))
        throw bad("needs dtype, shape and data_offsets");
      SafetensorsEntry e;
      e.name = name;
      if (!v["dtype"].is_string()) throw bad("has a non-string dtype");
      e.dtype_name = v["dtype"].get<std::string>();
      e.dtype_known = parse_safetensors_dtype(e.dtype_name, &e.dtype);
      if (!v["shape"].is_array()) throw bad("has a shape that is not an array");
      for (const json& d : v["shape"]) {
        if (!d.is_number_integer() || d.get<int64_t>() < 0)
          throw bad("has a negative or non-integer dimension");
        e.shape.push_back(d.get<int64_t>());
      }
      const json& off = v["data_offsets"];
      if (!off.is_array() || off.size() != 2 || !off[0].is_number_unsigned() || !off[1].is_number_unsigned())
        throw bad("has data_offsets that are not two non-negative integers");
      e.begin = off[0].get<uint64_t>();
      e.end = off[1].get<uint64_t>();
      if (e.begin > e.end || e.end > data_bytes)
        throw bad(detail::cat("has data_offsets [", e.begin, ", ", e.end, "] outside the ", data_bytes,
                              "-byte data section"));
      // The element count and byte size are computed without wrapping: a shape such as [2^62, 4] of F32
      // wraps to 0 elements, which would match an empty data range. A zero dimension makes the tensor
      // empty whatever the others are ([2^62, 4, 0] holds nothing), as in PyTorch.
      const bool empty = std::find(e.shape.begin(), e.shape.end(), int64_t(0)) != e.shape.end();
      uint64_t numel = empty ? 0 : 1, nbytes = 0;
      for (int64_t d : e.shape)
        if (!empty && __builtin_mul_overflow(numel, uint64_t(d), &numel))
          throw bad(
              detail::cat("has shape ", shape_str(e.shape), ", whose element count does not fit 64 bits"));
      if (e.dtype_known && __builtin_mul_overflow(numel, uint64_t(dtype_bytes(e.dtype)), &nbytes))
        throw bad(detail::cat("has shape ", shape_str(e.shape), " of ", e.dtype_name,
                              ", whose byte size does not fit 64 bits"));
      if (e.dtype_known && e.end - e.begin != nbytes)
        throw bad(detail::cat("has shape ", shape_str(e.shape), " of ", e.dtype_name, " (", nbytes,
                              " bytes) but ", e.end - e.begin, " bytes of data"));
      entries_.push_back(std::move(e));
    }
  } catch (...) {
    ::munmap(map_, map_bytes_);
    map_ = nullptr;
    throw;
  }
}

SafetensorsReader::~SafetensorsReader() {
  if (map_) ::munmap(map_, map_bytes_);
}

const SafetensorsEntry* SafetensorsReader::find(std::string_view name) const {
  for (const SafetensorsEntry& e : entries_)
    if (e.name == name) return &e;
  return nullptr;
}

void SafetensorsReader::read_f32(std::string_view name, std::span<const int64_t> expected_shape, float* dst,
                                 std::string_view context) const {
  std::string ctx = context.empty() ? std::string() : detail::cat(" (", context, ")");
  const SafetensorsEntry* e = find(name);
  if (!e)
    throw ConfigError(detail::cat("safetensors file ", path_, " has no tensor '", name, "'", ctx,
                                  "; the model expects shape ", shape_str(expected_shape),
                                  ". Check that the file matches the model config"));
  if (!std::equal(e->shape.begin(), e->shape.end(), expected_shape.begin(), expected_shape.end()))
    throw ConfigError(detail::cat("tensor '", name, "' in ", path_, " has shape ", shape_str(e->shape),
                                  ", the model", ctx, " expects ", shape_str(expected_shape),
                                  "; the model config does not match the checkpoint"));
  if (!e->dtype_known)
    throw ConfigError(detail::cat("tensor '", name, "' in ", path_, " is ", e->dtype_name,
                                  "; only F32, BF16 and F16 weights can be loaded"));
  convert_to_f32(e->dtype, data(*e), e->numel(), dst);
}

SafetensorsWriter::SafetensorsWriter(const std::string& path, std::vector<Decl> decls,
                                     const std::map<std::string, std::string>& metadata)
    : path_(path), tmp_(path + ".tmp"), decls_(std::move(decls)) {
  json header = json::object();
  json meta = json::object();
  meta["format"] = "pt";
  for (const auto& [k, v] : metadata) meta[k] = v;
  header["__metadata__"] = meta;
  uint64_t offset = 0;
  std::set<std::string> seen;
  for (const Decl& d : decls_) {
    STRATA_CHECK(seen.insert(d.name).second, "safetensors file ", path, ": tensor '", d.name,
                 "' declared twice");
    STRATA_CHECK(dtype_is_float(d.dtype), "safetensors file ", path, ": tensor '", d.name, "' is declared ",
                 dtype_name(d.dtype), "; only fp32, bf16 and fp16 tensors can be written");
    size_t numel = 1;
    for (int64_t s : d.shape) numel *= size_t(s);
    uint64_t bytes = numel * dtype_bytes(d.dtype);
    header[d.name] = {{"dtype", safetensors_dtype_name(d.dtype)},
                      {"shape", d.shape},
                      {"data_offsets", {offset, offset + bytes}}};
    offset += bytes;
  }
  std::string text = header.dump();
  text.append((8 - text.size() % 8) % 8, ' ');
  unsigned char len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    const int err = errno;
    throw_io(detail::cat("cannot create ", tmp_, " (written, then renamed to ", path_, ")"), err,
             write_hint(err));
  }
  try {
    put(len, 8);
    put(text.data(), text.size());
  } catch (...) {  // the destructor does not run for a constructor that throws
    ::close(fd_);
    ::unlink(tmp_.c_str());
    throw;
  }
}

SafetensorsWriter::~SafetensorsWriter() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void SafetensorsWriter::put(const void* data, size_t bytes) {
  const char* p = static_cast<const char*>(data);
  while (bytes > 0) {
    ssize_t w = ::write(fd_, p, bytes);
    if (w < 0 && errno == EINTR) continue;
    if (w <= 0) {
      const int err = w < 0 ? errno : EIO;
      throw_io(detail::cat("cannot write ", bytes, " bytes to ", tmp_), err, write_hint(err));
    }
    p += w;
    bytes -= size_t(w);
  }
}

void SafetensorsWriter::write_f32(std::string_view name, const float* src) {
  STRATA_CHECK(next_ < decls_.size() && decls_[next_].name == name, "safetensors file ", path_, ": wrote '",
               name, "' but the next declared tensor is '",
               next_ < decls_.size() ? decls_[next_].name : std::string("(none)"), "'");
  const Decl& d = decls_[next_++];
  size_t numel = 1;
  for (int64_t s : d.shape) numel *= size_t(s);
  constexpr size_t kBlock = size_t(1) << 20;  // elements converted per write
  std::vector<unsigned char> buf(std::min(numel, kBlock) * dtype_bytes(d.dtype));
  for (size_t i = 0; i < numel; i += kBlock) {
    size_t n = std::min(kBlock, numel - i);
    convert_from_f32(d.dtype, src + i, n, buf.data());
    put(buf.data(), n * dtype_bytes(d.dtype));
  }
}

void SafetensorsWriter::finish() {
  STRATA_CHECK(next_ == decls_.size(), "safetensors file ", path_, ": finish() after ", next_, " of ",
               decls_.size(), " declared tensors were written");
  // A failure below leaves no file behind: the destructor removes tmp_ while fd_ is open, this the rest.
  if (::fsync(fd_) != 0) {
    const int err = errno;
    throw_io("cannot flush " + tmp_ + " to disk", err, write_hint(err));
  }
  const int fd = fd_;
  fd_ = -1;
  int err = 0;
  std::string failed;  // what could not be done
  if (::close(fd) != 0) {
    err = errno;
    failed = "cannot close " + tmp_;
  } else if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    err = errno;
    failed = detail::cat("cannot rename ", tmp_, " to ", path_);
  }
  if (err != 0) {
    ::unlink(tmp_.c_str());
    throw_io(failed, err, write_hint(err));
  }
}

void save_weights(const std::string& path, ChunkProvider& chunks, DType dtype,
                  const std::map<std::string, std::string>& metadata) {
  const ModelLayout& layout = chunks.layout();
  std::vector<SafetensorsWriter::Decl> decls;
  for (const ChunkLayout& c : layout.chunks())
    for (const TensorSpec& t : c.stored) decls.push_back({t.hf_name, dtype, t.shape});
  std::map<std::string, std::string> meta = metadata;
  meta["strata.model_config"] = layout.config().to_json().dump();
  SafetensorsWriter w(path, std::move(decls), meta);
  std::vector<float> buf;
  for (const ChunkLayout& c : layout.chunks()) {
    buf.resize(c.padded_numel);
    chunks.read_params(c.id, buf.data());
    for (const TensorSpec& t : c.stored) w.write_f32(t.hf_name, buf.data() + t.offset);
  }
  w.finish();
}

WeightsSource::WeightsSource(const std::string& path, const ModelLayout& layout)
    : path_(path), layout_(layout) {
  // Which file holds each tensor: one file, or the shards a Hugging Face index names.
  if (ends_with(path, ".index.json")) {
    std::ifstream in(path);
    if (!in) {
      const int err = errno;
      throw_io("cannot open safetensors index " + path, err);
    }
    json idx;
    try {
      idx = json::parse(in);
    } catch (const json::exception& e) {  // parse_error, or out_of_range for 1e999
      throw ConfigError(detail::cat("safetensors index ", path, " is not valid JSON: ", e.what()));
    }
    if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
      throw ConfigError(detail::cat("safetensors index ", path, " has no \"weight_map\" object"));
    // The shard files in the order the index first names them, each with the tensors it should hold.
    std::vector<std::string> files;
    std::map<std::string, std::vector<std::string>> tensors_of;
    for (const auto& [tensor, file] : idx["weight_map"].items()) {
      if (!file.is_string())
        throw ConfigError(
            detail::cat("safetensors index ", path, ": weight_map[\"", tensor, "\"] is not a file name"));
      std::vector<std::string>& t = tensors_of[file.get<std::string>()];
      if (t.empty()) files.push_back(file.get<std::string>());
      t.push_back(tensor);
    }
    check_shards_exist(path, files, tensors_of);
    for (const std::string& f : files) {
      readers_.push_back(std::make_unique<SafetensorsReader>(dir_of(path) + "/" + f));
      for (const std::string& tensor : tensors_of[f]) where_[tensor] = readers_.back().get();
    }
  } else {
    readers_.push_back(std::make_unique<SafetensorsReader>(path));
    for (const SafetensorsEntry& e : readers_.back()->entries()) where_[e.name] = readers_.back().get();
  }
  // Every tensor the model needs is named before any is read.
  for (const ChunkLayout& c : layout.chunks())
    for (const TensorSpec& t : c.stored)
      if (!where_.count(t.hf_name))
        throw ConfigError(detail::cat(
            "safetensors ", path, " has no tensor '", t.hf_name, "' (chunk ", c.id, " ", c.name, ", tensor ",
            t.name, ", shape ", shape_str(t.shape), "); check that the file matches the model config",
            layout.config().tie_embeddings ? "" : " (untied embeddings need lm_head.weight)"));
}

WeightsSource::~WeightsSource() = default;

void WeightsSource::read_chunk(int chunk_id, float* out) const {
  read_chunk(layout_.chunk(chunk_id), out);
}

void WeightsSource::read_chunk(const ChunkLayout& c, float* out) const {
  std::fill(out, out + c.padded_numel, 0.0f);
  for (const TensorSpec& t : c.stored)
    where_.at(t.hf_name)->read_f32(t.hf_name, t.shape, out + t.offset,
                                   detail::cat("chunk ", c.id, " ", c.name, ", tensor ", t.name));
}

std::vector<std::string> WeightsSource::unused() const {
  std::set<std::string> used;
  for (const ChunkLayout& c : layout_.chunks())
    for (const TensorSpec& t : c.stored) used.insert(t.hf_name);
  std::vector<std::string> out;
  for (const auto& [name, reader] : where_)
    if (!used.count(name)) out.push_back(name);
  return out;
}

void load_weights(const std::string& path, const ModelLayout& layout,
                  const std::function<void(int chunk_id, const float* data)>& sink) {
  WeightsSource src(path, layout);
  std::vector<float> buf;
  for (const ChunkLayout& c : layout.chunks()) {
    buf.resize(c.padded_numel);
    src.read_chunk(c.id, buf.data());
    sink(c.id, buf.data());
  }
  src.warn_unused("safetensors");
}

void WeightsSource::warn_unused(std::string_view who) const {
  for (const std::string& name : unused())
    STRATA_LOG_WARN(who, " ", path_, ": tensor '", name, "' is not part of the model; skipped");
}

void load_weights(const std::string& path, InMemoryChunks& chunks) {
  load_weights(path, chunks.layout(), [&](int id, const float* data) {
    std::memcpy(chunks.params(id), data, chunks.layout().chunk(id).padded_numel * sizeof(float));
  });
}

}  // namespace strata::model
