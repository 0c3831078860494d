// tests/kernels/cuda_test_util.h: device buffers, bf16 conversions and the no-GPU skip for the CUDA tests.
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdint>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "core/cuda_check.h"
#include "core/device.h"
#include "kernels/cpu/ops.h"
#include "kernels/cuda/ops.h"
#include "tests/kernels/reference.h"  // to_bf16, from_bf16

namespace strata::kernels::test {

// Empty when a GPU is visible; otherwise why not.
inline std::string no_gpu_reason() {
  int n = 0;
  const cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();
    return std::string("no CUDA GPU visible (cudaGetDeviceCount: ") + cudaGetErrorString(e) + ")";
  }
  if (n == 0) return "no CUDA GPU visible (cudaGetDeviceCount: 0 devices)";
  return "";
}

// A device array of n elements of T (host type: float, std::int32_t, or cpu::bf16_t for bf16 bits).
template <typename T>
class DeviceBuffer {
 public:
  explicit DeviceBuffer(std::size_t n) : n_(n) {
    STRATA_CUDA_CHECK(cudaMalloc(&ptr_, bytes() ? bytes() : 1));
  }
  explicit DeviceBuffer(const std::vector<T>& host) : DeviceBuffer(host.size()) { upload(host); }
  ~DeviceBuffer() { cudaFree(ptr_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;

  std::size_t bytes() const { return n_ * sizeof(T); }
  T* get() const { return static_cast<T*>(ptr_); }
  // The buffer as bf16 (for T = cpu::bf16_t) or any other same-sized device type.
  template <typename U>
  U* as() const {
    static_assert(sizeof(U) == sizeof(T));
    return static_cast<U*>(ptr_);
  }
  void upload(const std::vector<T>& host) {
    STRATA_CUDA_CHECK(cudaMemcpy(ptr_, host.data(), bytes(), cudaMemcpyHostToDevice));
  }
  std::vector<T> download() const {
    std::vector<T> host(n_);
    STRATA_CUDA_CHECK(cudaDeviceSynchronize());
    STRATA_CUDA_CHECK(cudaMemcpy(host.data(), ptr_, bytes(), cudaMemcpyDeviceToHost));
    return host;
  }
  // All bits set: NaN as fp32, bf16 and fp16, so an element a kernel fails to write fails the check.
  void poison() { STRATA_CUDA_CHECK(cudaMemset(ptr_, 0xFF, bytes())); }

 private:
  void* ptr_ = nullptr;
  std::size_t n_;
};

// Fresh random values already representable in bf16, so the CPU reference and the device see the same
// inputs. The seed comes from the caller (tests draw it from std::random_device and report it).
inline std::vector<float> random_bf16_values(std::size_t n, std::uint64_t seed, float scale = 1.0f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> dist(0.0f, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = cpu::bf16_to_f32(cpu::f32_to_bf16(dist(rng)));
  return v;
}

// A CUDA test: skipped with the reason when no GPU is visible; owns a cuda strata::Device (for the Gemm
// workspace and op scratch, as the runtime allocates them) and a stream on it.
class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string reason = no_gpu_reason();
    if (!reason.empty()) GTEST_SKIP() << reason;
    device_ = strata::open_device({.backend = "cuda"});
    STRATA_CUDA_CHECK(cudaSetDevice(device_->caps().ordinal));
    STRATA_CUDA_CHECK(cudaStreamCreate(&stream_));
    seed_ = std::random_device{}();
  }
  void TearDown() override {
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  // Device memory for an op's scratch (at least one byte), counted by device_.
  strata::DeviceBuffer scratch(std::size_t bytes) {
    return strata::DeviceBuffer(*device_, bytes, "test scratch");
  }

  std::unique_ptr<strata::Device> device_;
  // A new seed per draw, derived from this run's fresh seed (printed by the tests on failure).
  std::uint64_t next_seed() { return seed_ * 1000003ull + draws_++; }

  cudaStream_t stream_ = nullptr;
  std::uint64_t seed_ = 0;
  std::uint64_t draws_ = 0;
};

}  // namespace strata::kernels::test
