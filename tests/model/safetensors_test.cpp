// Safetensors: the format on disk, bit-exact round trips in F32/BF16/F16, and the errors a mismatched
// checkpoint gets.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <vector>

#include "core/error.h"
#include "core/files.h"
#include "kernels/cpu/ops.h"
#include "model/safetensors.h"
#include "model_test_util.h"

namespace strata::model {
namespace {

using json = nlohmann::json;

std::vector<unsigned char> file_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::vector<unsigned char>((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// A file of only a header (no data section): the 8-byte little-endian length, then `header` as given.
void write_header_only(const std::string& path, const std::string& header) {
  std::string bytes(8, '\0');
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = char(uint64_t(header.size()) >> (8 * i));
  std::ofstream(path, std::ios::binary) << bytes << header;
}

// Rounds every parameter through `t` so that a write in `t` must read back bit-exactly.
void make_representable(InMemoryChunks& ch, DType t) {
  const size_t n = ch.layout().total_padded_numel();
  std::vector<uint16_t> tmp(n);
  if (t == DType::bf16) {
    kernels::cpu::cast_f32_to_bf16(tmp.data(), ch.all_params(), n);
    kernels::cpu::cast_bf16_to_f32(ch.all_params(), tmp.data(), n);
  } else if (t == DType::fp16) {
    kernels::cpu::cast_f32_to_f16(tmp.data(), ch.all_params(), n);
    kernels::cpu::cast_f16_to_f32(ch.all_params(), tmp.data(), n);
  }
}

class WeightsRoundTrip : public ::testing::TestWithParam<std::tuple<DType, bool>> {};

TEST_P(WeightsRoundTrip, SaveThenLoadIsBitExact) {
  auto [dtype, tied] = GetParam();
  ModelConfig cfg = ModelConfig::preset("tiny");
  cfg.tie_embeddings = tied;
  InMemoryChunks src{ModelLayout(cfg, {16, 64})};
  src.init(21);
  make_representable(src, dtype);
  test::ScratchDir dir("model");
  std::string path = dir.file("weights.safetensors");
  save_weights(path, src, dtype, {{"step", "12"}});

  // Into a layout with other alignment: tensors land at other offsets, values must be identical.
  InMemoryChunks dst{ModelLayout(cfg, {1, 1})};
  load_weights(path, dst);
  for (const ChunkLayout& c : src.layout().chunks())
    for (size_t t = 0; t < c.tensors.size(); ++t) {
      const TensorSpec& a = c.tensors[t];
      const TensorSpec& b = dst.layout().chunk(c.id).tensors[t];
      ASSERT_EQ(std::memcmp(src.params(c.id) + a.offset, dst.params(c.id) + b.offset, a.numel * 4), 0)
          << a.hf_name;
    }

  SafetensorsReader r(path);
  EXPECT_EQ(r.metadata().at("format"), "pt");
  EXPECT_EQ(r.metadata().at("step"), "12");
  EXPECT_EQ(ModelConfig::from_json(json::parse(r.metadata().at("strata.model_config"))), cfg);
  EXPECT_EQ(r.entries().size(), size_t(tied ? 1 + 9 * cfg.n_layers + 1 : 1 + 9 * cfg.n_layers + 2));
  EXPECT_EQ(r.find("lm_head.weight") != nullptr, !tied);
  EXPECT_EQ(r.find("model.layers.1.self_attn.k_proj.weight")->dtype_name, safetensors_dtype_name(dtype));
}

INSTANTIATE_TEST_SUITE_P(Dtypes, WeightsRoundTrip,
                         ::testing::Combine(::testing::Values(DType::fp32, DType::bf16, DType::fp16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(safetensors_dtype_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_tied" : "_untied");
                         });

// The bytes on disk follow the format: 8-byte LE length, JSON header padded to 8, tensors back to back.
TEST(Safetensors, FileLayoutFollowsTheFormat) {
  test::ScratchDir dir("model");
  std::string path = dir.file("layout.safetensors");
  std::vector<float> a = {1.0f, -2.0f, 3.5f}, b = {0.25f, 8.0f};
  SafetensorsWriter w(path, {{"a", DType::fp32, {3}}, {"b", DType::bf16, {1, 2}}});
  w.write_f32("a", a.data());
  w.write_f32("b", b.data());
  w.finish();
  std::vector<unsigned char> bytes = file_bytes(path);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[size_t(i)];
  EXPECT_EQ(n % 8, 0u);
  ASSERT_EQ(bytes.size(), 8 + n + 12 + 4);
  json h = json::parse(bytes.begin() + 8, bytes.begin() + 8 + long(n));
  EXPECT_EQ(h["a"]["dtype"], "F32");
  EXPECT_EQ(h["a"]["data_offsets"], json::array({0, 12}));
  EXPECT_EQ(h["b"]["shape"], json::array({1, 2}));
  EXPECT_EQ(h["b"]["data_offsets"], json::array({12, 16}));
  float a0;
  std::memcpy(&a0, bytes.data() + 8 + n, 4);
  EXPECT_EQ(a0, 1.0f);
  uint16_t b1;
  std::memcpy(&b1, bytes.data() + 8 + n + 12 + 2, 2);
  EXPECT_EQ(b1, 0x4100);  // 8.0 in bf16
}

// Weights are written as F32, BF16 or F16; a tensor declared as another dtype is refused up front.
TEST(Safetensors, WriterRefusesNonFloatingPointDtypes) {
  test::ScratchDir dir("model");
  std::string path = dir.file("ids.safetensors");
  EXPECT_THROW(SafetensorsWriter(path, {{"ids", DType::i32, {4}}}), Error);
}

// A file assembled by hand (not by our writer), with an odd-length header and an unsupported dtype.
TEST(Safetensors, ReadsAFileWrittenByHand) {
  json h = {{"x", {{"dtype", "F16"}, {"shape", {2}}, {"data_offsets", {0, 4}}}},
            {"ids", {{"dtype", "I64"}, {"shape", {1}}, {"data_offsets", {4, 12}}}}};
  std::string text = h.dump() + " ";  // not a multiple of 8: readers must not assume padding
  std::vector<unsigned char> bytes(8);
  uint64_t n = text.size();
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<unsigned char>(n >> (8 * i));
  bytes.insert(bytes.end(), text.begin(), text.end());
  const uint16_t halves[2] = {0x3C00, 0xC000};  // 1.0, -2.0
  const auto* hp = reinterpret_cast<const unsigned char*>(halves);
  bytes.insert(bytes.end(), hp, hp + 4);
  bytes.insert(bytes.end(), 8, 0);
  test::ScratchDir dir("model");
  std::string path = dir.file("by_hand.safetensors");
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));

  SafetensorsReader r(path);
  ASSERT_EQ(r.entries().size(), 2u);
  float x[2];
  const int64_t shape[] = {2};
  r.read_f32("x", shape, x);
  EXPECT_EQ(x[0], 1.0f);
  EXPECT_EQ(x[1], -2.0f);
  EXPECT_FALSE(r.find("ids")->dtype_known);
  const int64_t one[] = {1};
  try {
    r.read_f32("ids", one, x);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("is I64"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, MissingTensorErrorNamesTheTensorAndTheFile) {
  ModelConfig untied = ModelConfig::preset("tiny"), tied = untied;
  tied.tie_embeddings = true;
  InMemoryChunks src{ModelLayout(tied)};
  src.init(1);
  test::ScratchDir dir("model");
  std::string path = dir.file("tied_only.safetensors");
  save_weights(path, src, DType::fp32);
  InMemoryChunks dst{ModelLayout(untied)};
  try {
    load_weights(path, dst);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("no tensor 'lm_head.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find(path), std::string::npos) << m;
    EXPECT_NE(m.find("[256, 32]"), std::string::npos) << m;
  }
}

TEST(Safetensors, WrongShapeErrorNamesBothShapes) {
  ModelConfig cfg = ModelConfig::preset("tiny"), wider = cfg;
  wider.ffn_dim = 96;
  InMemoryChunks src{ModelLayout(wider)};
  src.init(1);
  test::ScratchDir dir("model");
  std::string path = dir.file("wider.safetensors");
  save_weights(path, src, DType::bf16);
  InMemoryChunks dst{ModelLayout(cfg)};
  try {
    load_weights(path, dst);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    std::string m = e.what();
    EXPECT_NE(m.find("'model.layers.0.mlp.gate_proj.weight'"), std::string::npos) << m;
    EXPECT_NE(m.find("has shape [96, 32]"), std::string::npos) << m;
    EXPECT_NE(m.find("expects [64, 32]"), std::string::npos) << m;
  }
}

TEST(Safetensors, TiedModelSkipsAnUntiedHead) {
  ModelConfig untied = ModelConfig::preset("tiny"), tied = untied;
  tied.tie_embeddings = true;
  InMemoryChunks src{ModelLayout(untied)};
  src.init(3);
  test::ScratchDir dir("model");
  std::string path = dir.file("untied_for_tied.safetensors");
  save_weights(path, src, DType::fp32);
  InMemoryChunks dst{ModelLayout(tied)};
  load_weights(path, dst);
  // Every tensor of the tied model, the shared embedding included, holds the file's bytes.
  for (int c = 0; c < dst.layout().num_chunks(); ++c) {
    for (const TensorSpec& t : dst.layout().chunk(c).tensors) {
      int src_chunk = -1;
      const TensorSpec* s = src.layout().find_hf(t.hf_name, &src_chunk);
      ASSERT_NE(s, nullptr) << t.hf_name;
      EXPECT_EQ(std::memcmp(dst.params(c) + t.offset, src.params(src_chunk) + s->offset, t.numel * 4), 0)
          << t.hf_name;
    }
  }
}

// Hugging Face's sharded layout in `dir`: the even chunks' tensors in model-00001-of-00002.safetensors,
// the odd ones' in model-00002-of-00002.safetensors, and model.safetensors.index.json naming the shard of
// every tensor.
void write_two_shards(const test::ScratchDir& dir, const InMemoryChunks& src) {
  const ModelLayout& layout = src.layout();
  json weight_map = json::object();
  for (int shard = 0; shard < 2; ++shard) {
    std::vector<SafetensorsWriter::Decl> decls;
    std::vector<const float*> data;
    for (const ChunkLayout& c : layout.chunks())
      for (const TensorSpec& t : c.tensors)
        if ((c.id % 2) == shard) {
          decls.push_back({t.hf_name, DType::fp32, t.shape});
          data.push_back(src.params(c.id) + t.offset);
        }
    std::string file = "model-0000" + std::to_string(shard + 1) + "-of-00002.safetensors";
    SafetensorsWriter w(dir.file(file), decls);
    for (size_t i = 0; i < decls.size(); ++i) {
      w.write_f32(decls[i].name, data[i]);
      weight_map[decls[i].name] = file;
    }
    w.finish();
  }
  std::ofstream(dir.file("model.safetensors.index.json"))
      << json{{"metadata", json::object()}, {"weight_map", weight_map}}.dump();
}

// A message for a user: no check text ("file.cpp:53: `fd >= 0` failed") in it.
void expect_no_check_text(const std::string& m) {
  EXPECT_EQ(m.find("` failed"), std::string::npos) << m;
  EXPECT_EQ(m.find(".cpp:"), std::string::npos) << m;
}

TEST(Safetensors, LoadsAShardedCheckpointThroughItsIndex) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  InMemoryChunks src{ModelLayout(cfg)};
  src.init(8);
  const ModelLayout& layout = src.layout();
  test::ScratchDir dir("model");
  write_two_shards(dir, src);
  InMemoryChunks dst{ModelLayout(cfg)};
  load_weights(dir.file("model.safetensors.index.json"), dst);
  EXPECT_EQ(std::memcmp(dst.all_params(), src.all_params(), layout.total_padded_numel() * 4), 0);
}

// A shard the index lists but the directory lacks (an interrupted download) is named, with the index that
// lists it and what to do, before any shard is opened.
TEST(Safetensors, AMissingShardIsNamedWithTheIndexAndWhatToDo) {
  ModelConfig cfg = ModelConfig::preset("tiny");
  InMemoryChunks src{ModelLayout(cfg)};
  src.init(8);
  test::ScratchDir dir("model");
  write_two_shards(dir, src);
  std::filesystem::remove(dir.file("model-00002-of-00002.safetensors"));
  InMemoryChunks dst{ModelLayout(cfg)};
  try {
    load_weights(dir.file("model.safetensors.index.json"), dst);
    FAIL() << "a missing shard was not noticed";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find(dir.file("model-00002-of-00002.safetensors")), std::string::npos) << m;
    EXPECT_NE(m.find("safetensors index " + dir.file("model.safetensors.index.json")), std::string::npos)
        << m;
    EXPECT_NE(m.find("1 of the 2 shard files it lists is missing"), std::string::npos) << m;
    EXPECT_NE(m.find("download the model again"), std::string::npos) << m;
    EXPECT_EQ(m.find("model-00001-of-00002"), std::string::npos) << "the shard that is there: " << m;
    expect_no_check_text(m);
  }
  // Both gone: both named.
  std::filesystem::remove(dir.file("model-00001-of-00002.safetensors"));
  try {
    load_weights(dir.file("model.safetensors.index.json"), dst);
    FAIL() << "missing shards were not noticed";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("2 of the 2 shard files it lists are missing"), std::string::npos) << m;
    EXPECT_NE(m.find("model-00001-of-00002.safetensors"), std::string::npos) << m;
    EXPECT_NE(m.find("model-00002-of-00002.safetensors"), std::string::npos) << m;
  }
}

TEST(Safetensors, AFileThatCannotBeOpenedIsAnIoErrorNamingIt) {
  test::ScratchDir dir("model");
  const std::string path = dir.file("absent.safetensors");
  try {
    SafetensorsReader r(path);
    FAIL() << "opened a file that does not exist";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot open safetensors file " + path), std::string::npos) << m;
    EXPECT_NE(m.find("No such file or directory"), std::string::npos) << m;
    expect_no_check_text(m);
  }
  // An index that is not there: the same shape of message.
  InMemoryChunks dst{ModelLayout(ModelConfig::preset("tiny"))};
  try {
    load_weights(dir.file("model.safetensors.index.json"), dst);
    FAIL() << "opened an index that does not exist";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("cannot open safetensors index " +
                                         dir.file("model.safetensors.index.json")),
              std::string::npos)
        << e.what();
    expect_no_check_text(e.what());
  }
  // A directory where the file should be (open() accepts it; mmap would fail with ENODEV).
  std::filesystem::create_directories(dir.file("dir.safetensors"));
  try {
    SafetensorsReader r(dir.file("dir.safetensors"));
    FAIL() << "read a directory";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(dir.file("dir.safetensors") + " is a directory"), std::string::npos)
        << e.what();
  }
}

// The writer's create: a path whose parent is a regular file cannot be created even by root (ENOTDIR), so
// this case holds under any user; the read-only directory below is skipped where permissions do not bite.
TEST(Safetensors, WriterThatCannotCreateItsFileIsAnIoErrorNamingThePath) {
  test::ScratchDir dir("model");
  std::ofstream(dir.file("not-a-dir")) << "a regular file";
  const std::string path = dir.file("not-a-dir/model.safetensors");
  try {
    SafetensorsWriter w(path, {{"a", DType::fp32, {4}}});
    FAIL() << "created a file under a regular file";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot create " + path + ".tmp"), std::string::npos) << m;
    EXPECT_NE(m.find("Not a directory"), std::string::npos) << m;
    expect_no_check_text(m);
  }
  // save_weights (what `strata train --export NAME.safetensors` calls) goes through the same writer.
  InMemoryChunks ch{ModelLayout(ModelConfig::preset("tiny"))};
  ch.init(1);
  EXPECT_THROW(save_weights(dir.file("no-such-dir/model.safetensors"), ch, DType::bf16), IoError);
}

TEST(Safetensors, WriterIntoAReadOnlyDirectoryIsAnIoErrorNamingThePath) {
  test::ScratchDir dir("model");
  const std::string ro = dir.file("read-only");
  std::filesystem::create_directories(ro);
  ASSERT_EQ(::chmod(ro.c_str(), 0555), 0);
  if (probe_writable(ro) == 0) {
    ::chmod(ro.c_str(), 0755);
    GTEST_SKIP() << "a read-only directory is writable here (root, or CAP_DAC_OVERRIDE); "
                    "WriterThatCannotCreateItsFileIsAnIoErrorNamingThePath covers the refusal";
  }
  const std::string path = ro + "/model.safetensors";
  try {
    SafetensorsWriter w(path, {{"a", DType::fp32, {4}}});
    FAIL() << "created a file in a read-only directory";
  } catch (const IoError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("cannot create " + path + ".tmp"), std::string::npos) << m;
    EXPECT_NE(m.find("Permission denied"), std::string::npos) << m;
    EXPECT_NE(m.find("choose a directory this user can write"), std::string::npos) << m;
    expect_no_check_text(m);
  }
  ::chmod(ro.c_str(), 0755);
}

TEST(Safetensors, CorruptFilesAreRejected) {
  test::ScratchDir dir("model");
  std::string path = dir.file("corrupt.safetensors");
  const unsigned char huge[8] = {0xFF, 0xFF, 0xFF, 0xFF, 0, 0, 0, 0};
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(huge), 8);
  EXPECT_THROW(SafetensorsReader r(path), ConfigError);

  json h = {{"x", {{"dtype", "F32"}, {"shape", {4}}, {"data_offsets", {0, 8}}}}};  // 4 floats need 16 bytes
  std::string text = h.dump();
  std::vector<unsigned char> bytes(8);
  for (int i = 0; i < 8; ++i) bytes[size_t(i)] = static_cast<unsigned char>(uint64_t(text.size()) >> (8 * i));
  bytes.insert(bytes.end(), text.begin(), text.end());
  bytes.insert(bytes.end(), 8, 0);
  std::ofstream(path, std::ios::binary)
      .write(reinterpret_cast<const char*>(bytes.data()), long(bytes.size()));
  try {
    SafetensorsReader r(path);
    FAIL() << "no throw";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("tensor 'x'"), std::string::npos) << e.what();
  }
}

// A shape whose element count wraps around 64 bits ([2^62, 4] of F32: 0 elements when wrapped) must not
// pass the size check against an empty data range (found by fuzz/safetensors_fuzz's invariant).
TEST(Safetensors, AShapeWhoseSizeOverflowsIsRejected) {
  test::ScratchDir dir("model");
  const std::string path = dir.file("overflow.safetensors");
  for (const json& shape : {json{uint64_t(1) << 62, 4}, json{uint64_t(1) << 32, uint64_t(1) << 32},
                            json{1 << 21, 1 << 21, 1 << 22}}) {
    write_header_only(path,
                      json{{"w", {{"dtype", "F32"}, {"shape", shape}, {"data_offsets", {0, 0}}}}}.dump());
    try {
      SafetensorsReader r(path);
      FAIL() << "shape " << shape.dump() << " was accepted with " << r.entries().size() << " entries";
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find("does not fit 64 bits"), std::string::npos) << e.what();
    }
  }
}

// An empty tensor (a zero dimension) is valid and reads as nothing, whatever its other dimensions and even
// into a null buffer from an empty data section (found by fuzz/safetensors_fuzz: memcpy from null).
TEST(Safetensors, AnEmptyTensorReadsAsNothing) {
  test::ScratchDir dir("model");
  const std::string path = dir.file("empty.safetensors");
  for (const json& shape : {json{0, 4}, json{46116860184273849, 0, 4}, json{uint64_t(1) << 62, 4, 0}}) {
    for (const char* dtype : {"F32", "BF16"}) {
      write_header_only(path,
                        json{{"w", {{"dtype", dtype}, {"shape", shape}, {"data_offsets", {0, 0}}}}}.dump());
      SafetensorsReader r(path);
      ASSERT_EQ(r.entries().size(), 1u) << shape.dump();
      EXPECT_EQ(r.entries()[0].numel(), 0u) << shape.dump();
      const std::vector<int64_t> dims = shape.get<std::vector<int64_t>>();
      EXPECT_NO_THROW(r.read_f32("w", dims, nullptr)) << shape.dump() << " " << dtype;
    }
  }
}

// A header number beyond a double's range (nlohmann: out_of_range.406, not parse_error) is a ConfigError
// naming the file (found by fuzz/safetensors_fuzz).
TEST(Safetensors, AHeaderNumberTooLargeForADoubleIsRejected) {
  test::ScratchDir dir("model");
  const std::string path = dir.file("huge_number.safetensors");
  write_header_only(path, R"({"w":{"dtype":"F32","shape":[1e999],"data_offsets":[0,0]}})");
  try {
    SafetensorsReader r(path);
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("header is not valid JSON"), std::string::npos) << e.what();
  }
}

TEST(Safetensors, WriterRefusesOutOfOrderTensorsAndLeavesNoFile) {
  test::ScratchDir dir("model");
  std::string path = dir.file("unfinished.safetensors");
  std::vector<float> v(4, 1.0f);
  {
    SafetensorsWriter w(path, {{"a", DType::fp32, {4}}, {"b", DType::fp32, {4}}});
    EXPECT_THROW(w.write_f32("b", v.data()), Error);
    w.write_f32("a", v.data());
    EXPECT_THROW(w.finish(), Error);
  }
  EXPECT_FALSE(std::filesystem::exists(path));
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
}

}  // namespace
}  // namespace strata::model
