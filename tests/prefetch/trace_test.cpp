// The trace: the first pass is recorded, later passes replay it, and a changed order re-records.
#include <gtest/gtest.h>

#include "prefetch/trace.h"

namespace strata::prefetch {
namespace {

void pass(Trace& t, const std::vector<int>& order) {
  t.begin_pass();
  for (int c : order) t.on_acquire(c);
  t.end_pass();
}

TEST(Trace, FirstPassIsRecordedAndReplayed) {
  Trace t;
  EXPECT_FALSE(t.valid());
  pass(t, {0, 1, 2, 2, 1});
  ASSERT_TRUE(t.valid());
  EXPECT_EQ(t.entries(), (std::vector<int>{0, 1, 2, 2, 1}));
  t.begin_pass();
  EXPECT_EQ(t.mode(), Trace::Mode::replaying);
  for (int c : {0, 1, 2, 2, 1}) EXPECT_FALSE(t.on_acquire(c).diverged);
  EXPECT_FALSE(t.end_pass());
  EXPECT_EQ(t.divergences(), 0u);
  EXPECT_EQ(t.recordings(), 1u);
}

TEST(Trace, ChangedOrderIsRecordedFromThePassInProgress) {
  Trace t;
  pass(t, {0, 1, 2, 3});
  t.begin_pass();
  EXPECT_FALSE(t.on_acquire(0).diverged);
  Trace::Check c = t.on_acquire(2);
  EXPECT_TRUE(c.diverged);
  EXPECT_EQ(c.expected, 1);
  EXPECT_EQ(c.position, 1u);
  EXPECT_EQ(t.mode(), Trace::Mode::recording);
  t.on_acquire(1);
  t.end_pass();
  EXPECT_EQ(t.entries(), (std::vector<int>{0, 2, 1}));
  EXPECT_EQ(t.divergences(), 1u);
  t.begin_pass();
  EXPECT_EQ(t.mode(), Trace::Mode::replaying);
}

TEST(Trace, ShorterAndLongerPassesDiverge) {
  Trace t;
  pass(t, {0, 1, 2});
  t.begin_pass();
  t.on_acquire(0);
  EXPECT_TRUE(t.end_pass());  // ended early
  EXPECT_EQ(t.entries(), (std::vector<int>{0}));
  t.begin_pass();
  t.on_acquire(0);
  EXPECT_TRUE(t.on_acquire(5).diverged);  // past the end
  t.end_pass();
  EXPECT_EQ(t.entries(), (std::vector<int>{0, 5}));
  EXPECT_EQ(t.divergences(), 2u);
}

TEST(Trace, AbandonedPassKeepsTheTrace) {
  Trace t;
  pass(t, {0, 1, 2, 2, 1, 0});
  t.begin_pass();  // a forward whose backward never runs
  for (int c : {0, 1, 2}) t.on_acquire(c);
  t.abandon_pass();
  EXPECT_EQ(t.entries(), (std::vector<int>{0, 1, 2, 2, 1, 0}));
  EXPECT_EQ(t.divergences(), 0u);
  t.begin_pass();
  EXPECT_EQ(t.mode(), Trace::Mode::replaying);
  for (int c : {0, 1, 2, 2, 1, 0}) EXPECT_FALSE(t.on_acquire(c).diverged);
  EXPECT_FALSE(t.end_pass());
  EXPECT_EQ(t.recordings(), 1u);
}

TEST(Trace, AbandonedFirstPassRecordsNothing) {
  Trace t;
  t.begin_pass();
  t.on_acquire(0);
  t.abandon_pass();
  EXPECT_FALSE(t.valid());
  pass(t, {0, 1});
  EXPECT_EQ(t.entries(), (std::vector<int>{0, 1}));
}

TEST(Trace, NextUseLooksAheadInTheTrace) {
  Trace t;
  pass(t, {0, 1, 2, 1, 0});
  t.begin_pass();
  EXPECT_EQ(t.next_use(1, 1), 3);
  EXPECT_EQ(t.next_use(0, 0), 4);
  EXPECT_EQ(t.next_use(2, 2), -1);
  t.end_pass();
}

}  // namespace
}  // namespace strata::prefetch
