// The communicator every test of tests/comm uses, made once in main (comm_main.cpp) over the host
// backend, and the deterministic inputs each rank can compute for every other rank.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "core/device.h"
#include "core/dtype.h"

namespace strata::testing {

comm::Communicator& world();  // make_communicator(host device): mpi under mpirun, single otherwise
Device& host_device();

// Rank r's input element i: a value in [-8, 8) on a 1/64 grid from a hash of (r, i, salt), so every
// rank can compute every other rank's input. Rounded to the buffer's dtype when stored (stored_value).
inline float input_value(int rank, std::size_t i, std::uint32_t salt = 0) {
  std::uint64_t h = (std::uint64_t(rank) << 40) ^ std::uint64_t(i) ^ (std::uint64_t(salt) << 56);
  h ^= h >> 33;
  h *= 0xff51afd7ed558ccdull;
  h ^= h >> 33;
  h *= 0xc4ceb9fe1a85ec53ull;
  h ^= h >> 33;
  return float(std::int64_t(h % 1024) - 512) / 64.0f;
}

// n elements of `dtype` holding f(i) (floats converted with core's rounding; i32 / u8 from the integer).
template <class F>
std::vector<std::byte> make_buffer(DType dtype, std::size_t n, F&& f) {
  std::vector<std::byte> b(n * dtype_bytes(dtype));
  for (std::size_t i = 0; i < n; ++i) {
    const float v = f(i);
    switch (dtype) {
      case DType::fp32:
        reinterpret_cast<float*>(b.data())[i] = v;
        break;
      case DType::bf16:
        reinterpret_cast<std::uint16_t*>(b.data())[i] = f32_to_bf16(v);
        break;
      case DType::fp16:
        reinterpret_cast<std::uint16_t*>(b.data())[i] = f32_to_f16(v);
        break;
      case DType::i32:
        reinterpret_cast<std::int32_t*>(b.data())[i] = std::int32_t(v * 64);
        break;
      case DType::u8:
        reinterpret_cast<std::uint8_t*>(b.data())[i] = std::uint8_t(std::int32_t(v * 64));
        break;
    }
  }
  return b;
}

// v as a buffer of `dtype` holds it (core's rounding).
inline float stored_value(DType dtype, float v) {
  switch (dtype) {
    case DType::bf16:
      return bf16_to_f32(f32_to_bf16(v));
    case DType::fp16:
      return f16_to_f32(f32_to_f16(v));
    default:
      return v;
  }
}

inline float read_value(DType dtype, const std::byte* p, std::size_t i) {
  switch (dtype) {
    case DType::fp32:
      return reinterpret_cast<const float*>(p)[i];
    case DType::bf16:
      return bf16_to_f32(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::fp16:
      return f16_to_f32(reinterpret_cast<const std::uint16_t*>(p)[i]);
    case DType::i32:
      return float(reinterpret_cast<const std::int32_t*>(p)[i]);
    case DType::u8:
      return float(reinterpret_cast<const std::uint8_t*>(p)[i]);
  }
  return 0;
}

// The checks behind the parameterised suites (collective_check.cpp). Each runs one collective on world()
// (directly, or with its input copied in and its output copied out on a host-backend stream, to check
// stream ordering) and counts the elements that differ from a reference computed locally; it returns
// the number of mismatches after printing the first few through GoogleTest.
enum class Coll { broadcast, all_gather, reduce_scatter, all_reduce, reduce };
const char* coll_name(Coll c);
struct Case {
  Coll coll = Coll::all_reduce;
  DType dtype = DType::fp32;
  comm::ReduceOp op = comm::ReduceOp::sum;  // reductions only
  std::size_t count = 0;  // broadcast/all_reduce/reduce: the buffer; all_gather: send; reduce_scatter: recv
  bool in_place = false;
  bool stream = false;
  int root = 0;  // broadcast/reduce; clamped to world - 1
};
// Reference of a reduction: the left fold over ranks 0..N-1 in fp32 of the stored inputs, / N for avg,
// as a float (the caller rounds it to the dtype). NaN propagates through max/min.
float reference_reduce(const Case& c, int world, std::size_t input_index, std::uint32_t salt);
std::size_t run_and_check(comm::Communicator& comm, const Case& c, std::uint32_t salt);

}  // namespace strata::testing
