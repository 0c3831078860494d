// Parameterises a test body over device backends; the cuda case skips with the reason when no GPU is visible.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "core/device.h"

namespace strata::testing {

class DeviceTest : public ::testing::TestWithParam<std::string> {
 protected:
  std::unique_ptr<Device> open(std::size_t cap = 0) {
    if (GetParam() == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) return nullptr;
    }
    return open_device({.backend = GetParam(), .ordinal = 0, .memory_cap = cap});
  }
  void SetUp() override {
    if (GetParam() == "cuda") {
      std::string why;
      if (cuda_device_count(&why) == 0) GTEST_SKIP() << "no CUDA GPU visible: " << why;
    }
  }
};

inline std::string backend_name(const ::testing::TestParamInfo<std::string>& i) {
  return i.param;
}

}  // namespace strata::testing

#define STRATA_INSTANTIATE_BACKENDS(Suite)                                     \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite, ::testing::Values("host", "cuda"), \
                           ::strata::testing::backend_name)
