// Packed documents kept apart (Note [Packed documents] in model/packed_docs.h; kernels/cpu's Note [Document
// masks]) against transformers: tests/reference/make_reference.py's llama_packed and mistral_window_packed
// (window 16) hold two rows of documents packed back to back, the loss transformers computes for them with
// per-document position_ids and DataCollatorWithFlattening's labels, and each document's loss run alone.
//   - the packed loss equals transformers' (the family tests' masked-loss tolerance, 1e-5 relative);
//   - each document's loss in the packed row (the row's targets but that document's left out) equals its
//     loss run alone, within 1e-6 relative, and transformers' loss alone within 1e-5;
//   - without positions the documents see each other and the loss is another (the test can tell);
//   - with checkpointing the gradients are those without, bit for bit (the recomputation takes the
//     positions too), and one document per row is a forward without positions, bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "core/error.h"
#include "kernels/cpu/ops.h"
#include "model/chunk.h"
#include "model/hf_dir.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/loss_mask.h"
#include "model/safetensors.h"
#include "reference_util.h"
#include "tests/common/source_dir.h"

namespace strata::model {
namespace {

using testing::read_all;

// A dump's packed rows as the model takes them: inputs, targets and positions (B, T) from its (B, T + 1)
// input_ids, labels and position_ids (target t is label t + 1: -100 where token t + 1 starts a document).
struct Packed {
  std::string dir;
  nlohmann::json meta;
  int B = 0, T = 0;
  std::vector<std::int32_t> ids, in, tgt, pos;  // ids: (B, T + 1)
};

Packed packed(const std::string& name) {
  Packed p;
  p.dir = strata::test::source_path("tests/reference/data/" + name);
  p.meta = nlohmann::json::parse(std::ifstream(p.dir + "/reference.json"));
  p.B = p.meta["batch"], p.T = p.meta["seq_len"];
  const SafetensorsReader ref(p.dir + "/reference.safetensors");
  const std::vector<float> ids = read_all(ref, "input_ids"), labels = read_all(ref, "labels"),
                           pos = read_all(ref, "position_ids");
  const std::size_t W = std::size_t(p.T) + 1;
  for (int b = 0; b < p.B; ++b) {
    for (std::size_t t = 0; t < W; ++t) p.ids.push_back(std::int32_t(ids[b * W + t]));
    for (std::size_t t = 0; t < std::size_t(p.T); ++t) {
      p.in.push_back(std::int32_t(ids[b * W + t]));
      p.tgt.push_back(std::int32_t(labels[b * W + t + 1]));
      p.pos.push_back(std::int32_t(pos[b * W + t]));
    }
  }
  return p;
}

class PackedDocuments : public ::testing::TestWithParam<const char*> {
 protected:
  void SetUp() override {
    kernels::cpu::set_blas_threads(1);
    p_ = packed(GetParam());
    hf_ = std::make_unique<HfModel>(open_hf_model(p_.dir));
    chunks_ = std::make_unique<InMemoryChunks>(ModelLayout(hf_->config));
    load_weights(hf_->weights, *chunks_);
  }
  Packed p_;
  std::unique_ptr<HfModel> hf_;
  std::unique_ptr<InMemoryChunks> chunks_;
};

TEST_P(PackedDocuments, LossEqualsTransformersWithPositionIds) {
  LlamaModel m(hf_->config);
  const double want = p_.meta["packed_loss"];
  EXPECT_NEAR(m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T, p_.pos.data()), want, 1e-5 * want);
  // Without positions every row is one sequence: the documents see each other, and the loss moves well
  // past the tolerance above (by less with the window, which bounds how far back a document sees).
  const float talking = m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T);
  EXPECT_GT(std::fabs(talking - want), 20 * 1e-5 * want);
}

TEST_P(PackedDocuments, EachDocumentsLossInTheRowIsItsLossAlone) {
  LlamaModel m(hf_->config);
  const std::size_t W = std::size_t(p_.T) + 1;
  ASSERT_FALSE(p_.meta["document_losses"].empty());
  for (const auto& d : p_.meta["document_losses"]) {
    const int row = d[0], start = d[1], n = d[2];
    const double theirs = d[3];
    SCOPED_TRACE("row " + std::to_string(row) + ", document from " + std::to_string(start));
    // In the row: only this document's targets count (its tokens 1 .. n-1, at positions start .. start+n-2).
    std::vector<std::int32_t> only(p_.tgt.size(), kIgnoreTarget);
    for (int t = start; t < start + n - 1; ++t) {
      const std::size_t i = std::size_t(row) * std::size_t(p_.T) + std::size_t(t);
      ASSERT_GE(p_.tgt[i], 0);
      only[i] = p_.tgt[i];
    }
    const float in_row = m.forward(*chunks_, p_.in.data(), only.data(), p_.B, p_.T, p_.pos.data());
    // Alone: its n tokens, the first n - 1 as inputs, the last n - 1 as targets.
    const std::int32_t* doc = p_.ids.data() + std::size_t(row) * W + std::size_t(start);
    const float alone = m.forward(*chunks_, doc, doc + 1, 1, n - 1);
    EXPECT_NEAR(in_row, alone, 1e-6 * alone);
    EXPECT_NEAR(alone, theirs, 1e-5 * theirs);
  }
}

TEST_P(PackedDocuments, CheckpointedGradientsAreTheSameBitForBit) {
  std::vector<float> grads[2];
  const std::size_t n = chunks_->layout().total_padded_numel();
  for (const bool ckpt : {false, true}) {
    LlamaModel m(hf_->config, {.checkpoint_activations = ckpt});
    chunks_->zero_grads();
    m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T, p_.pos.data());
    m.backward(*chunks_);
    grads[ckpt].assign(chunks_->all_grads(), chunks_->all_grads() + n);
  }
  EXPECT_EQ(grads[0], grads[1]);
  // The documents' gradients are not those of rows that talk across them.
  LlamaModel m(hf_->config);
  chunks_->zero_grads();
  m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T);
  m.backward(*chunks_);
  EXPECT_NE(std::vector<float>(chunks_->all_grads(), chunks_->all_grads() + n), grads[0]);
}

TEST_P(PackedDocuments, OneDocumentPerRowIsAForwardWithoutPositionsBitForBit) {
  LlamaModel m(hf_->config);
  std::vector<std::int32_t> one(p_.pos.size());
  for (std::size_t i = 0; i < one.size(); ++i) one[i] = std::int32_t(i % std::size_t(p_.T));
  const float with = m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T, one.data());
  const float without = m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T);
  EXPECT_EQ(with, without);
  m.forward(*chunks_, p_.in.data(), nullptr, p_.B, p_.T, one.data());
  const std::vector<float> a = m.logits();
  m.forward(*chunks_, p_.in.data(), nullptr, p_.B, p_.T);
  EXPECT_EQ(a, m.logits());
}

TEST_P(PackedDocuments, PositionsThatAreNotDocumentsAreRefused) {
  LlamaModel m(hf_->config);
  std::vector<std::int32_t> bad = p_.pos;
  bad[5] += 2;
  try {
    m.forward(*chunks_, p_.in.data(), p_.tgt.data(), p_.B, p_.T, bad.data());
    FAIL() << "accepted";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("position_ids[0, 5]"), std::string::npos) << e.what();
  }
}

INSTANTIATE_TEST_SUITE_P(Dumps, PackedDocuments, ::testing::Values("llama_packed", "mistral_window_packed"));

}  // namespace
}  // namespace strata::model
