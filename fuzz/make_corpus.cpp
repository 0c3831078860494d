// strata_fuzz_corpus: writes the generated part of the seed corpora under fuzz/corpus/ — files made by
// the project's own writers, so each fuzzer starts from inputs its reader accepts. The hand-written seeds
// (near-valid inputs, the config files) sit beside them and are not touched.
//
// Usage: build-fuzz/fuzz/strata_fuzz_corpus fuzz/corpus     (then commit what changed)
// Inputs are kept small (a few KB): libFuzzer's mutations and the CI time budget favour short seeds.
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "core/device.h"
#include "core/error.h"
#include "model/chunk.h"
#include "model/config.h"
#include "model/layout.h"
#include "model/safetensors.h"
#include "model/token_file.h"
#include "tiering/manager.h"
#include "tiering/trace_writer.h"
#include "zero3/checkpoint.h"

namespace fs = std::filesystem;
using namespace strata;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), {});
}
void put(const fs::path& p, const std::string& bytes) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
  std::printf("%8zu  %s\n", bytes.size(), p.c_str());
}

// A Llama small enough that its whole safetensors file is about 2 KB.
model::ModelConfig micro_model() {
  model::ModelConfig c;
  c.name = "micro";
  c.vocab_size = 8;
  c.d_model = 4;
  c.n_layers = 1;
  c.n_heads = 2;
  c.n_kv_heads = 1;
  c.ffn_dim = 4;
  c.max_seq_len = 8;
  c.tie_embeddings = true;
  return c;
}

void safetensors_seeds(const fs::path& out, const fs::path& tmp) {
  model::ModelLayout layout(micro_model(), {.tensor_align = 1, .chunk_multiple = 1});
  model::InMemoryChunks chunks(layout);
  chunks.init(1);
  for (auto [dt, name] : {std::pair{DType::fp32, "micro_f32"}, {DType::bf16, "micro_bf16"}}) {
    const fs::path p = tmp / (std::string(name) + ".safetensors");
    model::save_weights(p, chunks, dt);
    put(out / "safetensors" / (std::string(name) + ".safetensors"), slurp(p));
  }
  // A generic file as other writers make them: F16 and a dtype Strata lists but does not load (I64).
  model::SafetensorsWriter w((tmp / "f16.safetensors").string(),
                             {{"a", DType::fp16, {2, 3}}, {"b", DType::fp32, {}}}, {{"note", "seed"}});
  const float a[6] = {1, -2, 0.5f, 65504, 1e-8f, 0}, b[1] = {3};
  w.write_f32("a", a);
  w.write_f32("b", b);
  w.finish();
  put(out / "safetensors" / "f16_scalar.safetensors", slurp(tmp / "f16.safetensors"));
  std::string header = R"({"ids":{"dtype":"I64","shape":[2],"data_offsets":[0,16]}})";
  header.append((8 - header.size() % 8) % 8, ' ');
  std::string file(8, '\0');
  for (int i = 0; i < 8; ++i) file[std::size_t(i)] = char((header.size() >> (8 * i)) & 0xff);
  file += header + std::string(16, '\1');
  put(out / "safetensors" / "i64.safetensors", file);
}

void checkpoint_seeds(const fs::path& out, const fs::path& tmp) {
  const fs::path dir = tmp / "ckpt";
  {
    zero3::CheckpointWriter w(dir.string(), "global_step3");
    const std::vector<float> master = {1, 2, 3, 4, 5, 6, 7, 8};
    const std::vector<std::uint16_t> half = {1, 2, 3};
    w.add({.name = "chunk0.master", .dtype = "fp32", .bytes = master.size() * 4}, master.data());
    w.add({.name = "chunk0.param", .dtype = "bf16", .bytes = half.size() * 2}, half.data());
    w.commit({{"step", 3}, {"world_size", 1}, {"config", {{"train_batch_size", 4}}}});
  }
  const std::string meta = slurp(dir / "global_step3" / "meta.json");
  const std::string shard = slurp(dir / "global_step3" / "rank0.shard");
  put(out / "checkpoint" / "valid", meta + "\n--shard--\n" + shard);
  put(out / "checkpoint" / "valid_fix_crc", meta + "\n--shard-fix-crc--\n" + shard);
  nlohmann::json legacy = nlohmann::json::parse(meta);
  legacy.erase("meta_crc32c");  // checkpoints from before the field still load
  put(out / "checkpoint" / "legacy_meta", legacy.dump() + "\n--shard--\n" + shard);
  put(out / "checkpoint" / "meta_only", meta);
}

void token_seeds(const fs::path& out, const fs::path& tmp) {
  const std::vector<std::uint32_t> tokens = {72, 101, 108, 108, 111, 44, 32, 119, 111, 114, 108, 100, 33, 10};
  for (auto [type, header, name] : {std::tuple{model::TokenType::u16, true, "llmc_u16.bin"},
                                    {model::TokenType::u32, true, "llmc_u32.bin"},
                                    {model::TokenType::u16, false, "flat_u16.bin"},
                                    {model::TokenType::u32, false, "flat_u32.bin"}}) {
    const fs::path p = tmp / name;
    model::write_token_file(p.string(), tokens, type, header);
    put(out / "token_file" / name, slurp(p));
  }
}

void memprof_seeds(const fs::path& out, const fs::path& tmp) {
  auto dev = open_device({.backend = "host", .memory_cap = 0});
  tiering::TierOptions to;
  to.device_budget = 1 << 20;
  to.pinned_budget = 1 << 20;
  to.pinned_slab_bytes = 256 << 10;
  tiering::TierManager tm(*dev, to, nullptr);
  const fs::path p = tmp / "run.memprof.jsonl";
  {
    tiering::TraceWriter w(tm, {.path = p.string(), .sample_interval_ms = 1});
    tm.set_step(0, tiering::Phase::forward);
    auto id = tm.register_tensor({.name = "layers.0.param",
                                  .kind = tiering::Kind::param,
                                  .dtype = DType::bf16,
                                  .bytes = 4096,
                                  .home = tiering::Tier::pinned});
    std::memset(tm.allocate(id, tiering::Tier::pinned), 1, 4096);
    tm.mark_written(id, tiering::Tier::pinned);
    tm.fetch(id, tiering::Tier::device).wait();
    tm.set_step(0, tiering::Phase::backward);
    auto g = tm.register_tensor(
        {.name = "layers.0.grad", .kind = tiering::Kind::grad, .bytes = 8192, .home = tiering::Tier::pinned});
    tm.allocate(g, tiering::Tier::device);
    tm.mark_written(g, tiering::Tier::device);
    tm.evict(g, tiering::Tier::device, tiering::Tier::pinned).wait();
    tm.set_step(1, tiering::Phase::optimizer);
    auto huge = tm.register_tensor({.name = "huge", .kind = tiering::Kind::master, .bytes = 4 << 20});
    try {
      tm.allocate(huge, tiering::Tier::device);
    } catch (const OutOfMemory&) {
      // recorded as an oom event
    }
    tm.synchronize();
  }
  const std::string trace = slurp(p);
  put(out / "memprof_trace" / "scripted.memprof.jsonl", trace);
  // A run killed mid-write: the last line is cut short (the reader skips it with a warning).
  std::size_t last = trace.rfind('\n', trace.size() - 2);
  put(out / "memprof_trace" / "cut_short.memprof.jsonl",
      trace.substr(0, last + 1 + (trace.size() - last) / 2));
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s CORPUS_DIR   (fuzz/corpus)\n", argv[0]);
    return 2;
  }
  try {
    const fs::path out = argv[1];
    const fs::path tmp = fs::temp_directory_path() / ("strata-fuzz-corpus-" + std::to_string(::getpid()));
    fs::create_directories(tmp);
    safetensors_seeds(out, tmp);
    checkpoint_seeds(out, tmp);
    token_seeds(out, tmp);
    memprof_seeds(out, tmp);
    fs::remove_all(tmp);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "strata_fuzz_corpus: %s\n", e.what());
    return 1;
  }
  return 0;
}
