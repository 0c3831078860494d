// fp16 dynamic loss scaling with DeepSpeed's semantics, and the combined unscale/clip factor.
#include <gtest/gtest.h>

#include <cmath>

#include "zero3/loss_scaler.h"

namespace strata::zero3 {
namespace {

Fp16Config fp16(std::int64_t hysteresis, std::int64_t window = 4) {
  Fp16Config c;
  c.enabled = true;
  c.initial_scale_power = 8;
  c.loss_scale_window = window;
  c.hysteresis = hysteresis;
  c.min_loss_scale = 1.0;
  return c;
}

TEST(LossScaler, DisabledIsOneAndAppliesFiniteSteps) {
  LossScaler s(Fp16Config{});
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_TRUE(s.update(false));
  EXPECT_EQ(s.skipped_steps(), 0);
}

TEST(LossScaler, OverflowSkipsAndHalvesTheScale) {
  LossScaler s(fp16(1));
  EXPECT_EQ(s.scale(), 256.0);
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 1);
}

TEST(LossScaler, HysteresisDelaysTheDecrease) {
  LossScaler s(fp16(2));
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 256.0);  // first overflow spends the hysteresis
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 128.0);
  EXPECT_EQ(s.skipped_steps(), 2);
}

TEST(LossScaler, ScaleDoublesAfterAWindowWithoutOverflow) {
  LossScaler s(fp16(1, 3));
  s.update(true);  // iter 0: overflow -> 128
  EXPECT_EQ(s.scale(), 128.0);
  s.update(false);  // iter 1
  s.update(false);  // iter 2
  EXPECT_EQ(s.scale(), 128.0);
  s.update(false);  // iter 3: 3 - 0 is a multiple of the window
  EXPECT_EQ(s.scale(), 256.0);
}

TEST(LossScaler, OverflowAtTheMinimumIsAnError) {
  Fp16Config c = fp16(1);
  c.initial_scale_power = 1;
  c.min_loss_scale = 1.0;
  LossScaler s(c);
  s.update(true);  // 2 -> 1
  EXPECT_EQ(s.scale(), 1.0);
  EXPECT_THROW(s.update(true), Error);
}

TEST(LossScaler, StaticScaleNeverChangesButStillSkips) {
  Fp16Config c = fp16(1);
  c.loss_scale = 64;
  LossScaler s(c);
  EXPECT_FALSE(s.dynamic());
  EXPECT_FALSE(s.update(true));
  EXPECT_EQ(s.scale(), 64.0);
}

TEST(LossScaler, StateRoundTrips) {
  LossScaler a(fp16(2));
  a.update(true), a.update(false), a.update(true), a.update(true);
  LossScaler b(fp16(2));
  b.load_state(a.state());
  for (bool o : {false, true, false, false, false, false}) EXPECT_EQ(a.update(o), b.update(o));
  EXPECT_EQ(a.scale(), b.scale());
  EXPECT_EQ(a.skipped_steps(), b.skipped_steps());
}

TEST(GradScale, UnscalesAndClips) {
  // Scaled gradients of norm 8 at loss scale 4: unscaled norm 2.
  GradScale g = grad_scale(64.0, 4.0, 0.0);
  EXPECT_DOUBLE_EQ(g.norm, 2.0);
  EXPECT_FALSE(g.clipped);
  EXPECT_FLOAT_EQ(g.factor, 0.25f);
  g = grad_scale(64.0, 4.0, 1.0);
  EXPECT_TRUE(g.clipped);
  EXPECT_FLOAT_EQ(g.factor, float(1.0 / (4.0 * (2.0 + 1e-6))));
  g = grad_scale(64.0, 4.0, 5.0);
  EXPECT_FALSE(g.clipped);
}

}  // namespace
}  // namespace strata::zero3
