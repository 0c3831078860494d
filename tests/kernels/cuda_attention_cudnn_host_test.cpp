// The parts of cuDNN's fused attention (kernels/cuda/attention_cudnn_impl.h) that run without a GPU, so
// every CI machine runs them; none is skipped for want of a GPU. The graph checks are skipped, saying so,
// only where the binary was built without the cuDNN path.
//   - Teardown: the handle owner CudnnAttention's Impl keeps its handle and graphs in releases every
//     dependent before the handle (Note [cuDNN handle lifetime]), checked with a fake handle whose create
//     and destroy, like the fake plans' destructors, record the order.
//   - Graph checks: every attention shape the cuda tests and the GPU bundle's runs reach cuDNN with passes
//     the frontend's host-side checks (validate() and the lowering without a handle), forward and backward,
//     deterministic and not, for sm80 and sm90 (the compiled targets) and sm100 (which sm90's PTX reaches),
//     against the libcudnn on this machine. A shape the frontend refuses fails here, in CI, instead of on the
//     GPU machine. The shapes, with where each comes from (B = micro-batch, T = sequence length):
//       tests/kernels: cuda_attention_cudnn_test.cpp (cuda_attention_cudnn_shapes.h, shared; with the
//         sliding-window shapes, the first of which CudaOpsAttendInASlidingWindowAsTheCpuDoes runs too),
//         compute_interface_test.cpp (2 x 5, 4/2 heads of 8; 2 x 12 in a window of 5),
//         cuda_shapes_1b_test.cpp (1 x 256 and 1 x 128 of 1b; 1 x 256, 16/2 heads of 128);
//       tests/zero3: backend_test.cpp (tiny, 2 x 32; tiny planned at 2 x 16 and run at 1 x 16; block_model's
//         4/4 heads of 32 at 2 x 16), device_state_test.cpp (tiny, 2 x 32), cuda_engine_shapes_test.cpp
//         (1b's blocks, 1 x 64);
//       tests/model: backend_test.cpp (tiny's heads, 2 x 12);
//       scripts/bundle-run.sh: strata train --model 1b (4 x 1024), step_bench -B 4 -T 512 of 1b, the loss
//         comparison (1 x 256 of 1b).
//     The presets (model/config.cpp): tiny has 4 query and 2 key/value heads of 8, 1b 32 and 4 of 64. The
//     cuda activations are bf16 (CudaOps), so every shape is checked in bf16.
//   - One token: the frontend's backward refuses s_q = s_kv = 1 (its forward takes it), so plan() is not
//     supported there and kernels/cuda's own kernel runs it.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <memory>
#include <ostream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/cuda/attention_cudnn.h"
#include "kernels/cuda/attention_cudnn_impl.h"
#include "tests/kernels/cuda_attention_cudnn_shapes.h"

namespace strata::kernels::test {
namespace {

// ---- teardown order ----------------------------------------------------------------------------------

// What the fake library did, in order, and the handles it has not destroyed.
std::vector<std::string>& events() {
  static std::vector<std::string> e;
  return e;
}
struct FakeContext {};
using FakeHandle = FakeContext*;
std::set<FakeHandle>& live_handles() {
  static std::set<FakeHandle> h;
  return h;
}

FakeHandle fake_create() {
  events().push_back("create handle");
  return *live_handles().insert(new FakeContext).first;
}
void fake_destroy(FakeHandle h) {
  events().push_back("destroy handle");
  live_handles().erase(h);
  delete h;
}

// Stands for a graph's execution plan: made with the handle, to be destroyed while the handle exists.
struct FakePlan {
  FakePlan(FakeHandle h, std::string n) : handle(h), name(std::move(n)) {}
  ~FakePlan() {
    events().push_back("destroy " + name + (live_handles().count(handle) ? "" : " after its handle"));
  }
  FakePlan(const FakePlan&) = delete;
  FakePlan& operator=(const FakePlan&) = delete;
  FakeHandle handle;
  std::string name;
};

// Stands for CudnnAttention's Impl::Entry: shared graphs, moved into the cache.
struct FakeEntry {
  std::shared_ptr<FakePlan> fwd, bwd;
};

TEST(CudnnHandleOwner, ReleasesEveryPlanBeforeTheHandle) {
  events().clear();
  {
    cudnn_impl::ShapeCache<FakeHandle, FakeEntry> cache(&fake_destroy);
    cache.adopt(fake_create());
    for (int T : {16, 32}) {
      const std::string t = std::to_string(T);
      cache.dependents().emplace(AttentionShape{.B = 1, .T = T, .NH = 4, .NKV = 2, .HD = 8},
                                 FakeEntry{std::make_shared<FakePlan>(cache.handle(), "forward T=" + t),
                                           std::make_shared<FakePlan>(cache.handle(), "backward T=" + t)});
    }
  }
  // The handle is created first and destroyed last; the plans, in whatever order the map releases them,
  // in between, each while its handle exists.
  ASSERT_EQ(events().size(), 6u);
  EXPECT_EQ(events().front(), "create handle");
  EXPECT_EQ(events().back(), "destroy handle");
  std::vector<std::string> plans(events().begin() + 1, events().end() - 1);
  std::sort(plans.begin(), plans.end());
  const std::vector<std::string> want{"destroy backward T=16", "destroy backward T=32",
                                      "destroy forward T=16", "destroy forward T=32"};
  EXPECT_EQ(plans, want);
}

TEST(CudnnHandleOwner, WithoutAHandleReleasesThePlansAndDestroysNothing) {
  events().clear();
  {
    cudnn_impl::ShapeCache<FakeHandle, FakeEntry> cache(&fake_destroy);  // cuDNN never opened
    cache.dependents().emplace(AttentionShape{.B = 1, .T = 8, .NH = 4, .NKV = 2, .HD = 8}, FakeEntry{});
  }
  EXPECT_TRUE(events().empty()) << events().front();
}

TEST(CudnnHandleOwner, RefusesASecondHandle) {
  events().clear();
  cudnn_impl::ShapeCache<FakeHandle, FakeEntry> cache(&fake_destroy);
  cache.adopt(fake_create());
  FakeHandle second = fake_create();
  EXPECT_THROW(cache.adopt(second), Error);
  EXPECT_NE(cache.handle(), second);
  fake_destroy(second);
}

// ---- the frontend's host-side graph checks -------------------------------------------------------------

struct UsedShape {
  const char* where;  // a name for the test: which test or run uses it
  AttentionShape shape;
};

constexpr AttentionShape shape(int B, int T, int NH, int NKV, int HD) {
  return {.B = B, .T = T, .NH = NH, .NKV = NKV, .HD = HD, .dtype = DType::bf16};
}

std::string describe(const AttentionShape& s) {
  std::ostringstream o;
  o << "B=" << s.B << " T=" << s.T << " NH=" << s.NH << " NKV=" << s.NKV << " HD=" << s.HD;
  if (s.window > 0) o << " window=" << s.window;
  o << " " << dtype_name(s.dtype);
  return o.str();
}

void PrintTo(const UsedShape& u, std::ostream* os) {
  *os << u.where << " " << describe(u.shape);
}

std::vector<UsedShape> used_shapes() {
  std::vector<UsedShape> v;
  for (const AttentionShape& s : cudnn_test_shapes()) v.push_back({"kernels_cudnn", s});
  v.push_back({"kernels_cudnn_ops", kCudaOpsShape});
  const std::vector<UsedShape> others{
      {"kernels_compute_interface", shape(2, 5, 4, 2, 8)},
      {"kernels_compute_interface", {.B = 2, .T = 12, .NH = 4, .NKV = 2, .HD = 8, .window = 5}},
      {"kernels_shapes_1b", shape(1, 256, 32, 4, 64)},
      {"kernels_shapes_1b", shape(1, 128, 32, 4, 64)},
      {"kernels_shapes_1b", shape(1, 256, 16, 2, 128)},
      {"zero3_backend_tiny", shape(2, 32, 4, 2, 8)},
      {"zero3_backend_tiny", shape(2, 16, 4, 2, 8)},
      {"zero3_backend_tiny", shape(1, 16, 4, 2, 8)},
      {"zero3_backend_block_model", shape(2, 16, 4, 4, 32)},
      {"zero3_device_state_tiny", shape(2, 32, 4, 2, 8)},
      {"zero3_cuda_engine_1b", shape(1, 64, 32, 4, 64)},
      {"model_backend_tiny", shape(2, 12, 4, 2, 8)},
      {"bundle_train_1b", shape(4, 1024, 32, 4, 64)},
      {"bundle_step_bench_1b", shape(4, 512, 32, 4, 64)},
      {"bundle_compare_1b", shape(1, 256, 32, 4, 64)},
  };
  v.insert(v.end(), others.begin(), others.end());
  return v;
}

// sm80 and sm90: CMAKE_CUDA_ARCHITECTURES; sm100: Blackwell, which the sm90 PTX runs on.
constexpr int kSms[] = {80, 90, 100};

// Why the graph checks cannot run in this binary, or "".
std::string graphs_skip_reason() {
  if (!CudnnAttention::compiled_in())
    return "this binary was built without the cuDNN frontend (cmake/StrataCudnn.cmake), so there are no "
           "cuDNN graphs to check";
  return "";
}

class CudnnAttentionGraphs : public ::testing::TestWithParam<UsedShape> {
 protected:
  void SetUp() override {
    if (const std::string why = graphs_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  }
};

TEST_P(CudnnAttentionGraphs, PassTheFrontendsHostChecks) {
  const AttentionShape& s = GetParam().shape;
  RecordProperty("cudnn_version", std::to_string(cudnn_impl::backend_version()));
  for (int sm : kSms)
    for (bool deterministic : {true, false}) {
      const cudnn_impl::GraphCheck c = cudnn_impl::check_graphs(s, deterministic, sm);
      EXPECT_TRUE(c.forward.empty()) << GetParam().where << ", " << describe(s) << ", sm" << sm
                                     << ", forward: " << c.forward;
      EXPECT_TRUE(c.backward.empty())
          << GetParam().where << ", " << describe(s) << ", sm" << sm
          << (deterministic ? ", deterministic" : ", non-deterministic") << ", backward: " << c.backward;
    }
}

INSTANTIATE_TEST_SUITE_P(UsedShapes, CudnnAttentionGraphs, ::testing::ValuesIn(used_shapes()),
                         [](const auto& info) {
                           const AttentionShape& s = info.param.shape;
                           std::ostringstream name;
                           name << info.param.where << "_b" << s.B << "_t" << s.T << "_nh" << s.NH << "_nkv"
                                << s.NKV << "_hd" << s.HD;
                           if (s.window > 0) name << "_window" << s.window;
                           return name.str();
                         });

TEST(CudnnAttentionGraphsOneToken, TheBackwardRefusesItTheForwardTakesIt) {
  if (const std::string why = graphs_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  for (int sm : kSms)
    for (bool deterministic : {true, false}) {
      const cudnn_impl::GraphCheck c = cudnn_impl::check_graphs(kOneTokenShape, deterministic, sm);
      EXPECT_TRUE(c.forward.empty()) << "sm" << sm << ": " << c.forward;
      EXPECT_FALSE(c.backward.empty()) << "sm" << sm << ": the frontend now takes s_q = s_kv = 1 backward; "
                                       << "move the one-token shape into cuda_attention_cudnn_test's shapes";
    }
  std::printf("one token, backward (cuDNN %zu): %s\n", cudnn_impl::backend_version(),
              cudnn_impl::check_graphs(kOneTokenShape, true, 90).backward.c_str());
}

// The checks also refuse what no GPU runs: a head dimension that is not a multiple of 8.
TEST(CudnnAttentionGraphsRefusal, AHeadDimensionNotAMultipleOfEightIsRefused) {
  if (const std::string why = graphs_skip_reason(); !why.empty()) GTEST_SKIP() << why;
  const cudnn_impl::GraphCheck c = cudnn_impl::check_graphs(shape(2, 64, 4, 2, 12), true, 90);
  EXPECT_FALSE(c.forward.empty());
  EXPECT_FALSE(c.backward.empty());
}

}  // namespace
}  // namespace strata::kernels::test
