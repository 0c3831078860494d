#include "zero3/checkpoint.h"

#include <fcntl.h>
#include <stdio.h>  // renameat2, RENAME_EXCHANGE
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "core/error.h"
#include "core/log.h"
#include "zero3/checksum.h"

namespace strata::zero3 {
namespace {

namespace fs = std::filesystem;
using detail::cat;

constexpr char kMagic[8] = {'S', 'T', 'R', 'A', 'T', 'A', 'C', 'K'};
constexpr std::uint64_t kHeaderBytes = 4096;
constexpr std::uint64_t kAlign = 4096;
constexpr std::size_t kHeaderUsed = 48;  // magic 8, version/rank/world/reserved 16, offset/bytes 16, crcs 8

std::uint64_t align_up(std::uint64_t x) {
  return (x + kAlign - 1) / kAlign * kAlign;
}

void put32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
void put64(unsigned char* p, std::uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}
std::uint32_t get32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

void write_all(int fd, const void* data, std::uint64_t bytes, std::uint64_t offset, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (bytes > 0) {
    std::size_t n = std::size_t(std::min<std::uint64_t>(bytes, 1ull << 30));
    ssize_t w = ::pwrite(fd, p, n, off_t(offset));
    if (w < 0 && errno == EINTR) continue;
    if (w < 0 && (errno == ENOSPC || errno == EDQUOT))
      throw IoError(cat("checkpoint file ", path, ": the file system is full (", detail::errno_text(errno),
                        ") with ", bytes,
                        " bytes still to write; the previous checkpoint is kept. Free space or "
                        "save elsewhere (--save)"));
    STRATA_SYS_CHECK(w > 0, "write ", n, " bytes at offset ", offset, " of checkpoint file ", path);
    p += w;
    bytes -= std::uint64_t(w);
    offset += std::uint64_t(w);
  }
}

void read_all(int fd, void* data, std::uint64_t bytes, std::uint64_t offset, const std::string& path,
              std::string_view what) {
  auto* p = static_cast<char*>(data);
  while (bytes > 0) {
    std::size_t n = std::size_t(std::min<std::uint64_t>(bytes, 1ull << 30));
    ssize_t r = ::pread(fd, p, n, off_t(offset));
    if (r < 0 && errno == EINTR) continue;
    STRATA_SYS_CHECK(r >= 0, "read ", what, " (", n, " bytes at offset ", offset, ") from ", path);
    if (r == 0)
      throw IoError(cat("checkpoint file ", path, " is truncated: ", what, " needs ", bytes,
                        " more bytes at offset ", offset,
                        "; the checkpoint is incomplete, load another tag"));
    p += r;
    bytes -= std::uint64_t(r);
    offset += std::uint64_t(r);
  }
}

void fsync_path(const std::string& path, bool directory) {
  int fd = ::open(path.c_str(), (directory ? O_DIRECTORY : 0) | O_RDONLY | O_CLOEXEC);
  STRATA_SYS_CHECK(fd >= 0, "open ", path, " to fsync it");
  int rc = ::fsync(fd);
  int err = errno;
  ::close(fd);
  errno = err;
  STRATA_SYS_CHECK(rc == 0, "fsync ", path);
}

void write_small_file(const std::string& path, const std::string& text) {
  int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_SYS_CHECK(fd >= 0, "create ", path);
  try {
    write_all(fd, text.data(), text.size(), 0, path);
    STRATA_SYS_CHECK(::fsync(fd) == 0, "fsync ", path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
}

std::string read_small_file(const std::string& path, const char* what) {
  std::ifstream in(path);
  if (!in)
    throw IoError(cat("cannot read ", what, " ", path, " (", detail::errno_text(errno),
                      "); is this a Strata checkpoint directory?"));
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

void check_tag(const std::string& tag) {
  if (tag.empty() || tag == "." || tag == ".." || tag == "latest" || tag.find('/') != std::string::npos ||
      tag.ends_with(".tmp") || tag.ends_with(".old"))
    throw ConfigError(cat("checkpoint tag '", tag,
                          "' is not usable: it must be a plain file name, not 'latest', without '/' and not "
                          "ending in .tmp or .old"));
}

std::string shard_name(int rank) {
  return cat("rank", rank, ".shard");
}

// The shard's tensor table (its checksum already matched): a JSON array of {"name", "dtype", "bytes",
// "offset", "crc32c"}, each tensor inside the data area [header, table). Anything else is an IoError
// naming the file and the entry, never json's own exception types.
std::vector<TensorRecord> parse_table(const std::string& text, const std::string& file,
                                      std::uint64_t table_offset) {
  const nlohmann::json table = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (!table.is_array())
    throw IoError(cat(file, ": the tensor table is not a JSON array; the file is damaged, load another tag"));
  std::vector<TensorRecord> out;
  for (std::size_t i = 0; i < table.size(); ++i) {
    const nlohmann::json& e = table[i];
    auto bad = [&](const char* what) {
      return IoError(cat(file, ": tensor table entry ", i, " ", what, " (", e.dump().substr(0, 200),
                         "); the file is damaged, load another tag"));
    };
    if (!e.is_object()) throw bad("is not an object");
    for (const char* key : {"name", "dtype"})
      if (!e.contains(key) || !e[key].is_string()) throw bad("lacks a string name or dtype");
    for (const char* key : {"bytes", "offset", "crc32c"})
      if (!e.contains(key) || !e[key].is_number_unsigned())
        throw bad("lacks a whole bytes, offset or crc32c");
    TensorRecord r{e["name"].get<std::string>(), e["dtype"].get<std::string>(),
                   e["bytes"].get<std::uint64_t>(), e["offset"].get<std::uint64_t>(), 0};
    if (e["crc32c"].get<std::uint64_t>() > 0xffffffffu) throw bad("has a crc32c wider than 32 bits");
    r.crc32c = std::uint32_t(e["crc32c"].get<std::uint64_t>());
    if (r.offset < kHeaderBytes || r.offset > table_offset || r.bytes > table_offset - r.offset)
      throw bad("lies outside the file's data area");
    out.push_back(std::move(r));
  }
  return out;
}

}  // namespace

std::string step_tag(std::int64_t step) {
  return cat("global_step", step);
}

std::string latest_tag(const std::string& dir) {
  std::string text = read_small_file(dir + "/latest", "the checkpoint pointer");
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.pop_back();
  if (text.empty()) throw IoError(cat(dir, "/latest is empty; name a tag to load explicitly"));
  return text;
}

// ---------------------------------------------------------------------------------------------- writer

CheckpointWriter::CheckpointWriter(std::string dir, std::string tag, int rank, int world,
                                   comm::Communicator* comm)
    : dir_(std::move(dir)), tag_(std::move(tag)), rank_(rank), world_(world), comm_(comm) {
  STRATA_CHECK(world_ == 1 || comm_, "CheckpointWriter: ", world_, " ranks need a communicator");
  check_tag(tag_);
  std::error_code ec;
  fs::create_directories(dir_, ec);
  if (ec)
    throw IoError(cat("cannot create checkpoint directory ", dir_, " (", ec.message(),
                      "); choose a writable --save directory"));
  tmp_ = dir_ + "/" + tag_ + ".tmp";
  if (rank_ == 0) {
    // Partial checkpoints of interrupted saves (TAG.tmp) are never loaded; they go now, each named.
    for (const fs::directory_entry& e : fs::directory_iterator(dir_, ec))
      if (e.is_directory() && e.path().filename().string().ends_with(".tmp") && e.path() != fs::path(tmp_)) {
        STRATA_LOG_WARN("checkpoint: removing ", e.path().string(),
                        ", a partial checkpoint left by an interrupted save");
        fs::remove_all(e.path(), ec);
      }
    fs::remove_all(tmp_, ec);
    fs::create_directory(tmp_, ec);
    if (ec) throw IoError(cat("cannot create ", tmp_, " (", ec.message(), ")"));
  }
  if (world_ > 1) comm_->barrier();  // DIR/TAG.tmp/ exists, emptied, before any rank writes into it
  file_ = tmp_ + "/" + shard_name(rank_);
  fd_ = ::open(file_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  STRATA_SYS_CHECK(fd_ >= 0, "create checkpoint file ", file_);
  end_ = kHeaderBytes;
}

CheckpointWriter::~CheckpointWriter() {
  if (fd_ >= 0) ::close(fd_);
  if (!committed_ && rank_ == 0) {  // the directory is rank 0's; other ranks' failures end the job
    std::error_code ec;
    fs::remove_all(tmp_, ec);
  }
}

void CheckpointWriter::add(TensorRecord rec, const void* data) {
  STRATA_CHECK(!committed_, "CheckpointWriter::add after commit");
  for (const TensorRecord& r : table_)
    STRATA_CHECK(r.name != rec.name, "tensor ", rec.name, " added twice to checkpoint ", file_);
  rec.offset = align_up(end_);
  rec.crc32c = crc32c(data, rec.bytes);
  write_all(fd_, data, rec.bytes, rec.offset, file_);
  end_ = rec.offset + rec.bytes;
  table_.push_back(std::move(rec));
}

std::string CheckpointWriter::commit(nlohmann::json meta) {
  STRATA_CHECK(!committed_, "CheckpointWriter::commit called twice");
  nlohmann::json table = nlohmann::json::array();
  for (const TensorRecord& r : table_)
    table.push_back({{"name", r.name},
                     {"dtype", r.dtype},
                     {"bytes", r.bytes},
                     {"offset", r.offset},
                     {"crc32c", r.crc32c}});
  const std::string table_text = table.dump();
  const std::uint64_t table_offset = align_up(end_);
  write_all(fd_, table_text.data(), table_text.size(), table_offset, file_);
  const std::uint32_t table_crc = crc32c(table_text.data(), table_text.size());

  unsigned char h[kHeaderBytes] = {};
  std::memcpy(h, kMagic, 8);
  put32(h + 8, kCheckpointVersion);
  put32(h + 12, std::uint32_t(rank_));
  put32(h + 16, std::uint32_t(world_));
  put64(h + 24, table_offset);
  put64(h + 32, table_text.size());
  put32(h + 40, table_crc);
  put32(h + 44, crc32c(h, 44));
  write_all(fd_, h, kHeaderBytes, 0, file_);
  STRATA_SYS_CHECK(::fsync(fd_) == 0, "fsync ", file_);
  ::close(fd_);
  fd_ = -1;

  // Every rank's file is complete (each rank's description gathered to all); rank 0 writes meta.json
  // and moves the directory into place, the others wait for that.
  std::uint64_t mine[3] = {table_offset + table_text.size(), table_.size(), table_crc};
  std::vector<std::uint64_t> all(3 * std::size_t(world_));
  if (world_ > 1)
    comm_->host_all_gather(mine, all.data(), sizeof mine);  // host memory, whatever the backend
  else
    std::copy(mine, mine + 3, all.begin());
  if (rank_ != 0) {
    comm_->barrier();  // rank 0 committed (or failed, which ends the job)
    committed_ = true;
    return dir_ + "/" + tag_;
  }
  meta["format"] = kCheckpointFormat;
  meta["version"] = kCheckpointVersion;
  meta["world_size"] = world_;
  meta["files"] = nlohmann::json::array();
  for (int r = 0; r < world_; ++r)
    meta["files"].push_back({{"rank", r},
                             {"file", shard_name(r)},
                             {"bytes", all[3 * std::size_t(r)]},
                             {"tensors", all[3 * std::size_t(r) + 1]},
                             {"table_crc32c", std::uint32_t(all[3 * std::size_t(r) + 2])}});
  // meta.json carries the CRC-32C of its own compact dump without that field (keys sorted, so the text is
  // canonical): a flipped digit anywhere in it is found on load.
  meta.erase("meta_crc32c");
  meta["meta_crc32c"] = crc32c(meta.dump().data(), meta.dump().size());
  write_small_file(tmp_ + "/meta.json", meta.dump(2) + "\n");
  fsync_path(tmp_, true);

  const std::string final_dir = dir_ + "/" + tag_, old = final_dir + ".old";
  std::error_code ec;
  fs::remove_all(old, ec);
  bool swapped = false;
  if (fs::exists(final_dir)) {
    // Replacing a tag: one atomic exchange of the two directories where the file system has it, so
    // DIR/TAG always exists; else moved aside first (a load finds TAG.old if killed in between).
    if (::renameat2(AT_FDCWD, tmp_.c_str(), AT_FDCWD, final_dir.c_str(), RENAME_EXCHANGE) == 0) {
      swapped = true;
      fs::rename(tmp_, old, ec);  // the previous checkpoint, removed below
    } else {
      fs::rename(final_dir, old, ec);
      if (ec) throw IoError(cat("cannot move the previous ", final_dir, " aside (", ec.message(), ")"));
    }
  }
  if (!swapped) {
    fs::rename(tmp_, final_dir, ec);
    if (ec) throw IoError(cat("cannot rename ", tmp_, " to ", final_dir, " (", ec.message(), ")"));
  }
  const std::string latest_tmp = dir_ + "/latest.tmp";
  write_small_file(latest_tmp, tag_ + "\n");
  fs::rename(latest_tmp, dir_ + "/latest", ec);
  if (ec) throw IoError(cat("cannot update ", dir_, "/latest (", ec.message(), ")"));
  fsync_path(dir_, true);
  fs::remove_all(old, ec);
  committed_ = true;
  if (world_ > 1) comm_->barrier();
  return final_dir;
}

// ---------------------------------------------------------------------------------------------- reader

CheckpointReader::CheckpointReader(const std::string& dir, const std::string& tag, int rank) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw IoError(cat("checkpoint directory ", dir, " does not exist; check --load"));
  tag_ = tag.empty() ? latest_tag(dir) : tag;
  path_ = dir + "/" + tag_;
  // A save that replaced TAG moves the old one to TAG.old before the new one takes its name; killed in
  // between, only TAG.old holds it.
  if (!fs::is_directory(path_, ec) && fs::is_directory(path_ + ".old", ec)) {
    STRATA_LOG_WARN("checkpoint: ", path_, " is missing and ", path_,
                    ".old holds it (a save over it was interrupted); loading that");
    path_ += ".old";
  }
  if (!fs::is_directory(path_, ec))
    throw IoError(cat("checkpoint ", path_, " does not exist",
                      tag.empty() ? " (named by " + dir + "/latest)" : std::string()));
  const std::string meta_path = path_ + "/meta.json";
  try {
    meta_ = nlohmann::json::parse(read_small_file(meta_path, "checkpoint metadata"));
  } catch (const nlohmann::json::exception& e) {
    throw IoError(cat(meta_path, " is not valid JSON (", e.what(), "); the checkpoint is damaged"));
  }
  // Every field is checked for its type before it is read: json's value() / get() throw their own
  // exception types (and convert a float to int without a range check) on a field of the wrong type.
  const auto format = meta_.is_object() ? meta_.find("format") : meta_.end();
  if (!meta_.is_object() || format == meta_.end() || !format->is_string() || *format != kCheckpointFormat)
    throw ConfigError(
        cat(meta_path, " is not a Strata checkpoint (format is not \"", kCheckpointFormat, "\")"));
  if (const auto c = meta_.find("meta_crc32c"); c != meta_.end()) {  // older checkpoints have none
    nlohmann::json rest = meta_;
    rest.erase("meta_crc32c");
    const std::string text = rest.dump();
    const std::uint32_t got = crc32c(text.data(), text.size());
    if (!c->is_number_unsigned() || c->get<std::uint64_t>() != got)
      throw IoError(cat(meta_path, ": checksum mismatch (stored ", c->dump(), ", computed ", got,
                        "); the metadata is damaged, load another tag"));
  }
  const auto version_it = meta_.find("version");
  if (version_it == meta_.end() || !version_it->is_number_integer())
    throw ConfigError(cat(meta_path, ": the checkpoint format version is missing or not a whole number (",
                          version_it == meta_.end() ? std::string("absent") : version_it->dump(),
                          "); the metadata is damaged"));
  const std::int64_t version = version_it->get<std::int64_t>();
  if (version < 1 || version > kCheckpointVersion)
    throw ConfigError(cat(meta_path, ": checkpoint format version ", version,
                          " is not supported (this build reads ", kCheckpointVersion,
                          "); load it with a newer Strata"));

  file_ = path_ + "/" + shard_name(rank);
  fd_ = ::open(file_.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd_ < 0) {
    const int err = errno;
    const auto world = meta_.find("world_size");
    throw IoError(cat("checkpoint ", path_, ": cannot open ", shard_name(rank), " (", detail::errno_text(err),
                      "); meta.json says ", world == meta_.end() ? std::string("1") : world->dump(),
                      " rank(s) wrote this checkpoint, so it is incomplete or damaged: load another tag"));
  }
  try {
    unsigned char h[kHeaderUsed];
    read_all(fd_, h, kHeaderUsed, 0, file_, "the header");
    if (std::memcmp(h, kMagic, 8) != 0)
      throw IoError(cat(file_, " does not start with the Strata checkpoint magic; the file is damaged"));
    if (get32(h + 44) != crc32c(h, 44))
      throw IoError(cat(file_, ": header checksum mismatch; the file is damaged, load another tag"));
    if (int(get32(h + 12)) != rank)
      throw IoError(cat(file_, " holds rank ", get32(h + 12), ", expected rank ", rank));
    const std::uint64_t toff = get64(h + 24), tbytes = get64(h + 32);
    const std::uint32_t tcrc = get32(h + 40);
    // The table lies inside the file (checked before its size is allocated: a header whose checksum
    // matches may still come from a faulty writer).
    struct stat st {};
    STRATA_SYS_CHECK(::fstat(fd_, &st) == 0, "fstat ", file_);
    const std::uint64_t file_bytes = std::uint64_t(st.st_size);
    if (toff < kHeaderBytes || toff > file_bytes || tbytes > file_bytes - toff)
      throw IoError(cat(file_, ": the header puts the tensor table at [", toff, ", +", tbytes,
                        ") outside the ", file_bytes,
                        "-byte file; the file is truncated or damaged, load another tag"));
    std::string text(tbytes, '\0');
    read_all(fd_, text.data(), tbytes, toff, file_, "the tensor table");
    std::uint32_t got = crc32c(text.data(), text.size());
    if (got != tcrc)
      throw IoError(cat(file_, ": tensor table checksum mismatch (stored ", tcrc, ", computed ", got,
                        "); the file is damaged, load another tag"));
    table_ = parse_table(text, file_, toff);
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

CheckpointReader::~CheckpointReader() {
  if (fd_ >= 0) ::close(fd_);
}

const TensorRecord* CheckpointReader::find(std::string_view name) const {
  for (const TensorRecord& r : table_)
    if (r.name == name) return &r;
  return nullptr;
}

void CheckpointReader::read(std::string_view name, void* dst, std::uint64_t bytes) const {
  const TensorRecord* r = find(name);
  if (!r)
    throw IoError(
        cat(file_, " has no tensor ", name, "; the checkpoint was saved by another model or config"));
  if (r->bytes != bytes)
    throw IoError(cat(file_, ": tensor ", name, " has ", r->bytes, " bytes, expected ", bytes,
                      "; the checkpoint was saved with another model or dtype"));
  read_all(fd_, dst, bytes, r->offset, file_, name);
  std::uint32_t got = crc32c(dst, bytes);
  if (got != r->crc32c)
    throw IoError(cat(file_, ": checksum mismatch in tensor ", name, " (stored ", r->crc32c, ", computed ",
                      got, "); the checkpoint is damaged, load another tag"));
}

std::vector<CheckpointTag> complete_checkpoints(const std::string& dir) {
  std::vector<CheckpointTag> found;
  std::error_code ec;
  if (!fs::exists(dir, ec)) return found;
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
    const std::string name = e.path().filename().string();
    if (!e.is_directory(ec) || name.ends_with(".removing") || name.ends_with(".tmp") ||
        name.ends_with(".old") || !fs::exists(e.path() / "meta.json", ec))
      continue;
    nlohmann::json meta;
    try {
      meta = nlohmann::json::parse(
          read_small_file((e.path() / "meta.json").string(), "the checkpoint's meta.json"));
    } catch (const std::exception&) {
      continue;  // not a checkpoint of this format (or a damaged one)
    }
    if (!meta.is_object() || meta.value("format", "") != kCheckpointFormat || !meta.contains("step"))
      continue;
    found.push_back({meta.at("step").get<std::int64_t>(), name});
  }
  if (ec) throw IoError(cat("cannot list the checkpoints of ", dir, " (", ec.message(), ")"));
  std::sort(found.begin(), found.end(), [](const CheckpointTag& a, const CheckpointTag& b) {
    return a.step != b.step ? a.step > b.step : a.tag > b.tag;
  });
  return found;
}

std::vector<std::string> rotate_checkpoints(const std::string& dir, std::int64_t keep_last) {
  std::vector<std::string> removed;
  if (keep_last <= 0) return removed;
  std::error_code ec;
  std::string latest;
  if (fs::exists(dir + "/latest", ec)) latest = latest_tag(dir);
  const std::vector<CheckpointTag> found = complete_checkpoints(dir);
  std::vector<std::string> leftovers;  // of an interrupted removal
  for (const fs::directory_entry& e : fs::directory_iterator(dir, ec))
    if (e.path().filename().string().ends_with(".removing")) leftovers.push_back(e.path().string());
  for (std::size_t i = std::size_t(keep_last); i < found.size(); ++i) {
    if (found[i].tag == latest) continue;
    const std::string from = dir + "/" + found[i].tag, to = from + ".removing";
    fs::rename(from, to, ec);
    if (ec)
      throw IoError(
          cat("checkpoint.keep_last: cannot move ", from, " aside to remove it (", ec.message(), ")"));
    leftovers.push_back(to);
    removed.push_back(found[i].tag);
  }
  for (const std::string& p : leftovers) {
    fs::remove_all(p, ec);
    if (ec) throw IoError(cat("checkpoint.keep_last: cannot remove ", p, " (", ec.message(), ")"));
  }
  return removed;
}

}  // namespace strata::zero3
