// tests/model/model_test_util.h: helpers shared by the model tests — the scratch directory (tests/common),
// deterministic text, a tiny-model config, and an AdamW training step over InMemoryChunks.
#pragma once

#include <random>
#include <string>
#include <vector>

#include "kernels/cpu/ops.h"
#include "model/chunk.h"
#include "model/llama.h"
#include "tests/common/scratch_dir.h"

namespace strata::model::testing {

// Sentences drawn from a small grammar with a fixed seed: text with structure a model can learn.
inline std::string grammar_text(size_t bytes, uint32_t seed) {
  static const char* subjects[] = {"the cat", "a dog", "my friend", "the old man", "a bird", "the child"};
  static const char* verbs[] = {"sees", "likes", "follows", "finds", "hears", "draws"};
  static const char* objects[] = {"the moon", "a red ball", "the river", "some bread", "the house", "a tree"};
  std::mt19937 rng(seed);
  std::string s;
  while (s.size() < bytes) {
    s += subjects[rng() % 6];
    s += ' ';
    s += verbs[rng() % 6];
    s += ' ';
    s += objects[rng() % 6];
    s += ". ";
  }
  s.resize(bytes);
  return s;
}

// AdamW over every parameter of `chunks` with the kernels' update; state kept here.
class AdamW {
 public:
  AdamW(InMemoryChunks& chunks, float lr)
      : chunks_(chunks), n_(chunks.layout().total_padded_numel()), m_(n_), v_(n_) {
    hp_.lr = lr;
    hp_.weight_decay = 0.0f;
  }
  void step() {
    ++step_;
    kernels::cpu::adamw_update(chunks_.all_params(), chunks_.all_grads(), m_.data(), v_.data(), nullptr, n_,
                               hp_, step_);
  }

 private:
  InMemoryChunks& chunks_;
  size_t n_;
  std::vector<float> m_, v_;
  kernels::cpu::AdamWParams hp_;
  int64_t step_ = 0;
};

// One step: zero grads, forward, backward, AdamW. Returns the loss before the update.
inline float train_step(LlamaModel& model, InMemoryChunks& chunks, AdamW& opt, const std::vector<int32_t>& in,
                        const std::vector<int32_t>& tgt, int B, int T) {
  chunks.zero_grads();
  float loss = model.forward(chunks, in.data(), tgt.data(), B, T);
  model.backward(chunks);
  opt.step();
  return loss;
}

}  // namespace strata::model::testing
