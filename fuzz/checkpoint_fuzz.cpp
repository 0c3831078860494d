// Fuzzes the checkpoint reader (zero3/checkpoint.h): CheckpointReader over a directory holding the
// input's meta.json and rank0.shard, then every tensor its table lists read back (checksums verified).
//
// Input: meta.json's text, a separator line, then rank0.shard's bytes. Two separators:
//   "\n--shard--\n"         the files as given: random damage mostly stops at a checksum, as it should;
//   "\n--shard-fix-crc--\n" the harness first recomputes meta.json's meta_crc32c (when present), the
//                           shard header's CRC and, when the header's table range lies in the file, the
//                           table's CRC — so mutations reach the code behind the checksums (the table's
//                           JSON, sizes and offsets), which a damaged disk cannot but a bug in a writer can.
// Without a separator the whole input is meta.json and there is no shard file.
#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_util.h"
#include "zero3/checkpoint.h"
#include "zero3/checksum.h"

namespace {

using namespace strata::zero3;

constexpr std::string_view kTarget = "checkpoint";
constexpr std::string_view kRaw = "\n--shard--\n";
constexpr std::string_view kFixCrc = "\n--shard-fix-crc--\n";
// Tensors up to this size are read back (the reader's own size checks come first either way).
constexpr std::uint64_t kMaxTensorBytes = 1 << 20;

std::uint64_t get64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
void put32(unsigned char* p, std::uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<unsigned char>(v >> (8 * i));
}

// The layout in zero3/checkpoint.h: table offset at 24, table bytes at 32, table CRC at 40, header CRC
// (of bytes 0..43) at 44.
void fix_shard_crcs(std::string& shard) {
  if (shard.size() < 48) return;
  auto* h = reinterpret_cast<unsigned char*>(shard.data());
  const std::uint64_t toff = get64(h + 24), tbytes = get64(h + 32);
  if (toff <= shard.size() && tbytes <= shard.size() - toff)
    put32(h + 40, crc32c(shard.data() + toff, std::size_t(tbytes)));
  put32(h + 44, crc32c(h, 44));
}

void fix_meta_crc(std::string& meta) {
  nlohmann::json j = nlohmann::json::parse(meta, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("meta_crc32c")) return;
  j.erase("meta_crc32c");
  const std::string text = j.dump();
  j["meta_crc32c"] = crc32c(text.data(), text.size());
  meta = j.dump();
}

void run(const std::string& dir) {
  CheckpointReader r(dir);
  if (r.tag() != "t") strata::fuzz::fail(kTarget, "the reader did not follow DIR/latest");
  (void)r.meta().dump();
  std::vector<unsigned char> buf;
  for (const TensorRecord& t : r.tensors()) {
    if (r.find(t.name) == nullptr) strata::fuzz::fail(kTarget, "find() misses tensor '" + t.name + "'");
    if (t.bytes > kMaxTensorBytes) continue;
    buf.assign(std::size_t(t.bytes), 0);
    try {
      r.read(t.name, buf.data(), t.bytes);
    } catch (const strata::IoError&) {
      // A short file or a checksum mismatch: refused as it should be; try the next tensor.
    }
  }
  try {
    r.read("no such tensor", buf.data(), 0);
    strata::fuzz::fail(kTarget, "read() of a missing tensor was not refused");
  } catch (const strata::IoError&) {
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  const std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string meta(input), shard;
  bool have_shard = false;
  const std::size_t raw = input.find(kRaw), fix = input.find(kFixCrc);
  if (raw != std::string_view::npos || fix != std::string_view::npos) {
    const bool fix_crc = fix < raw;  // the first separator decides
    const std::size_t at = fix_crc ? fix : raw;
    meta = std::string(input.substr(0, at));
    shard = std::string(input.substr(at + (fix_crc ? kFixCrc : kRaw).size()));
    have_shard = true;
    if (fix_crc) {
      fix_meta_crc(meta);
      fix_shard_crcs(shard);
    }
  }
  const std::string dir = strata::fuzz::scratch_dir() + "/ckpt";
  strata::fuzz::write_file("ckpt/latest", "t\n", 2);
  strata::fuzz::write_file("ckpt/t/meta.json", meta.data(), meta.size());
  const std::string shard_path = dir + "/t/rank0.shard";
  if (have_shard)
    strata::fuzz::write_file("ckpt/t/rank0.shard", shard.data(), shard.size());
  else
    std::remove(shard_path.c_str());
  strata::fuzz::expect_strata_errors(kTarget, [&] { run(dir); });
  return 0;
}
