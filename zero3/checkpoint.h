// strata/zero3/checkpoint.h: the checkpoint directory format (DESIGN.md §6) — atomic directories, the
// `latest` pointer, meta.json, and per-rank shard files with a header and a checksum per tensor.
//
// Example:
//   strata::zero3::CheckpointWriter w("ckpt", "global_step100", /*rank=*/0, /*world=*/1);
//   w.add({.name = "chunk3.master", .dtype = "fp32", .bytes = n * 4}, master_ptr);   // one per tensor
//   w.commit(meta);                       // ckpt/global_step100.tmp/ -> ckpt/global_step100/, ckpt/latest
//
//   strata::zero3::CheckpointReader r("ckpt");                 // the tag in ckpt/latest
//   int64_t step = r.meta().at("step");
//   r.read("chunk3.master", dst, n * 4);                       // checksum verified; IoError on mismatch
//
// Layout of DIR/TAG/:
//   meta.json           {"format": "strata.checkpoint", "version": 1, ... caller's fields ...,
//                        "files": [{"rank", "file", "bytes", "tensors", "table_crc32c"}],
//                        "meta_crc32c": CRC-32C of the compact dump of everything else (checked on load)}
//   rank<r>.shard       a 4096-byte header, the tensors' bytes back to back (each 4096-aligned), then the
//                       table: one JSON array of {"name", "dtype", "bytes", "offset", "crc32c"}.
// Header (little-endian): "STRATACK" magic, u32 version, u32 rank, u32 world, u32 reserved, u64 table
// offset, u64 table bytes, u32 table CRC-32C, u32 CRC-32C of the header's first 44 bytes.
//
// Note [Atomic checkpoints]: everything is written under DIR/TAG.tmp/ and fsynced; the directory is then
// renamed to DIR/TAG (an older DIR/TAG is moved aside first and removed after) and DIR/latest is replaced
// through a rename of DIR/latest.tmp. A crash leaves either the old checkpoint or the new one complete,
// plus at worst a stale TAG.tmp that the next save of that tag removes. Loading never trusts a size or an
// offset before the checksums of the header and the table match, and verifies each tensor's checksum as
// it is read.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <vector>

#include "comm/comm.h"

namespace strata::zero3 {

inline constexpr int kCheckpointVersion = 1;
inline constexpr const char* kCheckpointFormat = "strata.checkpoint";

struct TensorRecord {
  std::string name;   // unique within the rank's file: "chunk3.master"
  std::string dtype;  // "fp32", "bf16", "fp16"
  std::uint64_t bytes = 0;
  std::uint64_t offset = 0;  // in the shard file (filled by the writer)
  std::uint32_t crc32c = 0;  // of the bytes (filled by the writer)
};

class CheckpointWriter {
 public:
  // Creates DIR (if missing) and DIR/TAG.tmp/ (removing a stale one) and opens this rank's shard file.
  // Throws IoError naming the path, ConfigError for a tag that is not a plain file name.
  // With `comm` (world > 1, collective: every rank constructs and commits together) rank 0 prepares
  // DIR/TAG.tmp/ before any rank opens its file, and commit() waits for every rank's file before rank 0
  // writes meta.json (listing all of them) and moves the directory into place; every rank returns once
  // the checkpoint is committed.
  CheckpointWriter(std::string dir, std::string tag, int rank = 0, int world = 1,
                   comm::Communicator* comm = nullptr);
  // Without commit(): closes and removes DIR/TAG.tmp.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Appends one tensor's bytes (read from `data` before returning) to the shard file.
  void add(TensorRecord rec, const void* data);
  // Writes the table and header, meta.json (the caller's fields plus format, version and files), fsyncs,
  // renames DIR/TAG.tmp to DIR/TAG and points DIR/latest at TAG. Returns DIR/TAG.
  std::string commit(nlohmann::json meta);

  const std::string& tmp_dir() const { return tmp_; }
  std::uint64_t bytes_written() const { return end_; }

 private:
  std::string dir_, tag_, tmp_, file_;
  int rank_, world_;
  comm::Communicator* comm_ = nullptr;
  int fd_ = -1;
  std::uint64_t end_ = 0;
  std::vector<TensorRecord> table_;
  bool committed_ = false;
};

class CheckpointReader {
 public:
  // `tag` empty: the one DIR/latest names. Reads meta.json and this rank's shard file header and table,
  // verifying format, version and both checksums. Throws IoError (missing files, checksum mismatch,
  // truncation) or ConfigError (not a Strata checkpoint, newer version), naming the path.
  explicit CheckpointReader(const std::string& dir, const std::string& tag = "", int rank = 0);
  ~CheckpointReader();
  CheckpointReader(const CheckpointReader&) = delete;
  CheckpointReader& operator=(const CheckpointReader&) = delete;

  const nlohmann::json& meta() const { return meta_; }
  const std::string& path() const { return path_; }  // DIR/TAG
  const std::string& tag() const { return tag_; }
  const std::vector<TensorRecord>& tensors() const { return table_; }
  const TensorRecord* find(std::string_view name) const;
  // Reads tensor `name` into dst, which holds exactly `bytes`; IoError when the name is missing, the size
  // differs, the file is short, or the checksum does not match (naming file, tensor, both checksums).
  void read(std::string_view name, void* dst, std::uint64_t bytes) const;

 private:
  std::string path_, tag_, file_;
  nlohmann::json meta_;
  std::vector<TensorRecord> table_;
  int fd_ = -1;
};

// The tag DIR/latest names; IoError when there is none.
std::string latest_tag(const std::string& dir);
// "global_step<N>", DeepSpeed's tag.
std::string step_tag(std::int64_t step);

// The complete checkpoints of `dir`: directories holding this format's meta.json with its step (not
// TAG.tmp, TAG.old or TAG.removing), newest first (by step, then by name). None when `dir` does not exist.
// Raises IoError naming `dir` when it cannot be listed.
struct CheckpointTag {
  std::int64_t step = 0;
  std::string tag;
};
std::vector<CheckpointTag> complete_checkpoints(const std::string& dir);

// Note [Checkpoint rotation]: keeps the newest `keep_last` complete checkpoints of `dir` (directories
// holding this format's meta.json, newest by their step, then by name) and removes the older ones, never
// the one `dir`/latest names (the newest in practice; a run resumed with --load-tag may save an older
// step). A checkpoint being removed is first renamed to TAG.removing, so a crash part-way leaves nothing
// that looks like a checkpoint; such leftovers are removed by the next rotation. Directories being written
// (TAG.tmp) or moved aside (TAG.old) are not checkpoints and are left alone. keep_last 0 keeps all.
// Returns the tags removed. Raises IoError naming the path when a removal fails.
std::vector<std::string> rotate_checkpoints(const std::string& dir, std::int64_t keep_last);

}  // namespace strata::zero3
