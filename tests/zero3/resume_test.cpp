// Checkpoints of the engine: resuming gives bit-identical losses — from NVMe-resident state too, and into
// a different placement — damage is detected on load, and the weights export to safetensors.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "engine_util.h"
#include "zero3/checkpoint.h"

namespace strata::zero3 {
namespace {

using test::make_config;
using test::make_tokens;
using test::ScratchDir;
using test::Trainer;

// Warmup schedule and fp16-free bf16 run: the schedule's position matters for the resumed losses.
nlohmann::json schedule() {
  return {{"scheduler",
           {{"type", "WarmupDecayLR"},
            {"params", {{"warmup_num_steps", 3}, {"total_num_steps", 20}, {"warmup_max_lr", 3e-3}}}}}};
}

using Placements = std::tuple<OffloadDevice, OffloadDevice>;  // (saved with, resumed with), both offloads
class Resume : public ::testing::TestWithParam<Placements> {};

TEST_P(Resume, ContinuesWithBitIdenticalLosses) {
  const auto [saved_with, resumed_with] = GetParam();
  ScratchDir d("resume");
  const std::string tokens = make_tokens(d);
  kernels::cpu::set_blas_threads(1);
  std::vector<double> straight;
  {
    Trainer t(make_config(saved_with, saved_with, d.path(), schedule()), tokens);
    straight = t.run(5);
  }
  {
    Trainer t(make_config(saved_with, saved_with, d.path(), schedule()), tokens);
    std::vector<double> first = t.run(2);
    EXPECT_EQ(first[0], straight[0]);
    EXPECT_EQ(first[1], straight[1]);
    t.engine.save_checkpoint(d.file("ckpt"), {{"epoch", 0}, {"note", "resume test"}}, &t.data);
  }
  Trainer t(make_config(resumed_with, resumed_with, d.path(), schedule()), tokens);
  nlohmann::json client = t.engine.load_checkpoint(d.file("ckpt"), "", &t.data);
  EXPECT_EQ(client.at("note"), "resume test");
  EXPECT_EQ(t.engine.global_step(), 2);
  std::vector<double> rest = t.run(3);
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(rest[std::size_t(i)], straight[std::size_t(i + 2)]) << "step " << i + 3;
}

INSTANTIATE_TEST_SUITE_P(Placements, Resume,
                         ::testing::Values(Placements{OffloadDevice::none, OffloadDevice::none},
                                           Placements{OffloadDevice::cpu, OffloadDevice::cpu},
                                           Placements{OffloadDevice::nvme, OffloadDevice::nvme},
                                           Placements{OffloadDevice::nvme, OffloadDevice::cpu},
                                           Placements{OffloadDevice::cpu, OffloadDevice::nvme}),
                         [](const auto& info) {
                           return std::string(test::name(std::get<0>(info.param))) + "_to_" +
                                  test::name(std::get<1>(info.param));
                         });

TEST(Resume, DamagedCheckpointFailsToLoad) {
  ScratchDir d("resume-damage");
  const std::string tokens = make_tokens(d);
  std::string path;
  {
    Trainer t(make_config(OffloadDevice::nvme, OffloadDevice::nvme, d.path()), tokens);
    t.run(1);
    path = t.engine.save_checkpoint(d.file("ckpt"), {}, &t.data);
  }
  CheckpointReader r(d.file("ckpt"));
  const TensorRecord* rec = r.find("block.0.exp_avg_sq");
  ASSERT_NE(rec, nullptr);
  int fd = ::open((path + "/rank0.shard").c_str(), O_RDWR);
  ASSERT_GE(fd, 0);
  float x = 12345.0f;
  ASSERT_EQ(::pwrite(fd, &x, 4, off_t(rec->offset + 8)), 4);
  ::close(fd);
  Trainer t(make_config(OffloadDevice::nvme, OffloadDevice::nvme, d.path()), tokens);
  try {
    t.engine.load_checkpoint(d.file("ckpt"));
    FAIL() << "a damaged checkpoint loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("block.0.exp_avg_sq"), std::string::npos) << e.what();
  }
}

// One changed digit in meta.json (here the step) is found on load: the metadata carries its checksum.
TEST(Resume, AChangedDigitInTheMetadataIsFound) {
  ScratchDir d("resume-meta");
  const std::string tokens = make_tokens(d);
  std::string path;
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
    t.run(1);
    path = t.engine.save_checkpoint(d.file("ckpt"), {}, &t.data);
  }
  std::string text;
  {
    std::ifstream in(path + "/meta.json");
    text.assign(std::istreambuf_iterator<char>(in), {});
  }
  const std::size_t at = text.find("\"step\": 1");
  ASSERT_NE(at, std::string::npos) << text;
  text[at + 8] = '7';
  std::ofstream(path + "/meta.json") << text;
  Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
  try {
    t.engine.load_checkpoint(d.file("ckpt"));
    FAIL() << "a changed meta.json loaded";
  } catch (const IoError& e) {
    EXPECT_NE(std::string(e.what()).find("meta.json: checksum mismatch"), std::string::npos) << e.what();
  }
}

// A checkpoint missing a rank's shard file is named as incomplete (an IoError a user can act on, not an
// internal check).
TEST(Resume, AMissingShardFileIsNamed) {
  ScratchDir d("resume-missing");
  const std::string tokens = make_tokens(d);
  std::string path;
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
    t.run(1);
    path = t.engine.save_checkpoint(d.file("ckpt"), {}, &t.data);
  }
  ASSERT_EQ(std::remove((path + "/rank0.shard").c_str()), 0);
  Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
  try {
    t.engine.load_checkpoint(d.file("ckpt"));
    FAIL() << "a checkpoint without its shard file loaded";
  } catch (const IoError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("cannot open rank0.shard"), std::string::npos) << what;
    EXPECT_NE(what.find("load another tag"), std::string::npos) << what;
    EXPECT_EQ(what.find("failed:"), std::string::npos) << "an internal check's form: " << what;
  }
}

TEST(Resume, OtherModelIsRejected) {
  ScratchDir d("resume-model");
  const std::string tokens = make_tokens(d);
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
    t.engine.save_checkpoint(d.file("ckpt"));
  }
  model::ModelConfig other = model::ModelConfig::preset("tiny");
  other.n_layers = 3;
  Engine e(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), other);
  EXPECT_THROW(e.load_checkpoint(d.file("ckpt")), ConfigError);
}

TEST(Resume, WeightsExportToSafetensors) {
  ScratchDir d("resume-export");
  Trainer t(make_config(OffloadDevice::nvme, OffloadDevice::nvme, d.path()), make_tokens(d));
  t.run(2);
  const std::string path = d.file("model.safetensors");
  model::save_weights(path, t.engine, DType::bf16);
  // Read back into an in-memory model: every tensor equals the engine's master rounded to bf16.
  model::InMemoryChunks back{model::ModelLayout(t.mcfg)};
  model::load_weights(path, back);
  for (int c = 0; c < t.engine.layout().num_chunks(); ++c) {
    const std::vector<float> master = t.engine.master_params(c);
    const model::ChunkLayout& cl = t.engine.layout().chunk(c);
    for (const model::TensorSpec& ts : cl.tensors)
      for (std::size_t i = 0; i < ts.numel; i += 97) {
        const float want = kernels::cpu::bf16_to_f32(kernels::cpu::f32_to_bf16(master[ts.offset + i]));
        ASSERT_EQ(back.params(c)[back.layout().chunk(c).tensor(ts.name).offset + i], want)
            << ts.hf_name << " " << i;
      }
  }
}

// Adam with adam_w_mode (DeepSpeed's default) is AdamW's update: a checkpoint of one resumes under the
// other with the uninterrupted run's losses; Adam without it (L2 in the gradient) is refused by name.
TEST(ResumeOptimizer, AdamWAndAdamInAdamWModeAreOneUpdate) {
  ScratchDir d("resume-adam");
  const std::string tokens = make_tokens(d);
  const nlohmann::json adam_w = {{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", true}}}}}};
  const nlohmann::json adam_l2 = {{"optimizer", {{"type", "Adam"}, {"params", {{"adam_w_mode", false}}}}}};
  std::vector<double> straight;
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
    straight = t.run(3);
  }
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path()), tokens);
    t.run(2);
    t.engine.save_checkpoint(d.file("ckpt"), {}, &t.data);
  }
  {
    Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), adam_w), tokens);
    t.engine.load_checkpoint(d.file("ckpt"), "", &t.data);
    EXPECT_EQ(t.run(1)[0], straight[2]);
  }
  Trainer t(make_config(OffloadDevice::cpu, OffloadDevice::cpu, d.path(), adam_l2), tokens);
  try {
    t.engine.load_checkpoint(d.file("ckpt"), "", &t.data);
    FAIL() << "an AdamW checkpoint loaded under Adam with adam_w_mode false";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("optimizer.type is Adam (adam_w_mode false)"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace strata::zero3
