// A micro-batch in two halves (Engine::forward, then Engine::backward: what the Python binding's
// engine(ids) / engine.backward(loss) call) trains exactly as forward_backward, and a forward abandoned
// before its backward changes nothing: not the losses, not the prefetch trace.
#include <gtest/gtest.h>

#include <fstream>

#include "tests/common/demo_config.h"
#include "tests/common/source_dir.h"
#include "tests/zero3/engine_util.h"

namespace strata::zero3::test {
namespace {

struct Losses {
  std::vector<double> losses;
  std::uint64_t invalidations = 0;
};

// The stock demo config on the tiny model, accumulation 2. `split`: forward and backward as two calls;
// `abandon`: before each micro-batch, a forward of another batch that is abandoned.
Losses train_split(const std::string& tokens, bool split, bool abandon) {
  nlohmann::json doc = strata::test::demo_config_doc();
  doc["gradient_accumulation_steps"] = 2;
  const Config cfg = Config::parse(nlohmann::json::parse(doc.dump()));
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  kernels::cpu::set_blas_threads(1);
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = 32});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file,
                         {.batch_size = engine.micro_batch(), .seq_len = 32, .seed = 3, .vocab_size = 256});
  model::DataLoader other(file,
                          {.batch_size = engine.micro_batch(), .seq_len = 32, .seed = 4, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  Losses r;
  for (int step = 0; step < 4; ++step) {
    for (int i = 0; i < engine.accumulation_steps(); ++i) {
      if (abandon) {
        const model::Batch x = other.next();
        engine.forward(m, x.inputs.data(), x.targets.data(), x.rows, x.seq_len);
        EXPECT_TRUE(engine.forward_pending());
        engine.abandon_forward();
        EXPECT_FALSE(engine.forward_pending());
      }
      const model::Batch b = data.next();
      if (split) {
        engine.forward(m, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
        engine.backward(m);
      } else {
        engine.forward_backward(m, b);
      }
      EXPECT_EQ(engine.pending_micro_steps(), i + 1);
    }
    r.losses.push_back(engine.step().loss);
  }
  r.invalidations = engine.prefetch_stats().invalidations;
  return r;
}

TEST(SplitPass, ForwardThenBackwardIsForwardBackward) {
  ScratchDir d("split-pass");
  const std::string tokens = make_tokens(d);
  const Losses whole = train_split(tokens, false, false), split = train_split(tokens, true, false);
  EXPECT_EQ(split.losses, whole.losses);
}

TEST(SplitPass, AbandonedForwardChangesNothing) {
  ScratchDir d("split-abandon");
  const std::string tokens = make_tokens(d);
  const Losses whole = train_split(tokens, false, false), abandoned = train_split(tokens, true, true);
  EXPECT_EQ(abandoned.losses, whole.losses);
  EXPECT_EQ(abandoned.invalidations, whole.invalidations);  // the trace survived the abandoned passes
}

TEST(SplitPass, OutOfOrderCallsAreRefused) {
  ScratchDir d("split-order");
  const std::string tokens = make_tokens(d);
  Config cfg = Config::parse(strata::test::demo_config_doc());
  const model::ModelConfig mcfg = model::ModelConfig::preset("tiny");
  Engine engine(cfg, mcfg, {.backend = "", .device_memory_cap = 0, .seq_len = 32});
  model::TokenFile file = model::TokenFile::open(tokens);
  model::DataLoader data(file, {.batch_size = engine.micro_batch(), .seq_len = 32, .vocab_size = 256});
  model::LlamaModel m(mcfg, engine.model_options());
  EXPECT_THROW(engine.backward(m), Error);        // no forward
  EXPECT_THROW(engine.abandon_forward(), Error);  // none pending
  const model::Batch b = data.next();
  engine.forward(m, b.inputs.data(), b.targets.data(), b.rows, b.seq_len);
  EXPECT_THROW(engine.forward(m, b.inputs.data(), b.targets.data(), b.rows, b.seq_len), Error);  // pending
  EXPECT_THROW(engine.step(), Error);  // inside the pass
  engine.backward(m);
  EXPECT_THROW(engine.backward(m), Error);  // already taken
  EXPECT_TRUE(engine.step().applied);
}

}  // namespace
}  // namespace strata::zero3::test
