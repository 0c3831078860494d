// The oracle of tests/comm: run one collective, compare every element with a locally computed reference.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "tests/comm/comm_env.h"

namespace strata::testing {

const char* coll_name(Coll c) {
  switch (c) {
    case Coll::broadcast:
      return "broadcast";
    case Coll::all_gather:
      return "all_gather";
    case Coll::reduce_scatter:
      return "reduce_scatter";
    case Coll::all_reduce:
      return "all_reduce";
    case Coll::reduce:
      return "reduce";
  }
  return "?";
}

float reference_reduce(const Case& c, int world, std::size_t i, std::uint32_t salt) {
  float acc = stored_value(c.dtype, input_value(0, i, salt));
  for (int r = 1; r < world; ++r) {
    const float v = stored_value(c.dtype, input_value(r, i, salt));
    switch (c.op) {
      case comm::ReduceOp::sum:
      case comm::ReduceOp::avg:
        acc += v;
        break;
      case comm::ReduceOp::max:
        acc = std::isnan(acc) ? acc : std::isnan(v) ? v : std::max(acc, v);
        break;
      case comm::ReduceOp::min:
        acc = std::isnan(acc) ? acc : std::isnan(v) ? v : std::min(acc, v);
        break;
    }
  }
  if (c.op == comm::ReduceOp::avg) acc /= float(world);
  return acc;
}

std::size_t run_and_check(comm::Communicator& comm, const Case& c, std::uint32_t salt) {
  const int W = comm.world_size(), me = comm.rank();
  const int root = std::min(c.root, W - 1);
  const std::size_t es = dtype_bytes(c.dtype), n = c.count;
  auto input = [&](int r, std::size_t i) { return input_value(r, i, salt); };

  // Input and output extents in elements, the expected output, and where the input sits in `buf`.
  std::size_t in_n = n, out_n = n, in_at = 0;
  bool check_output = true;
  std::vector<std::byte> expected;
  switch (c.coll) {
    case Coll::broadcast:
      expected = make_buffer(c.dtype, n, [&](std::size_t i) { return input(root, i); });
      break;
    case Coll::all_gather:
      out_n = W * n;
      in_at = c.in_place ? me * n : 0;
      expected = make_buffer(c.dtype, out_n, [&](std::size_t i) { return input(int(i / n), i % n); });
      break;
    case Coll::reduce_scatter:
      in_n = W * n;
      expected =
          make_buffer(c.dtype, n, [&](std::size_t i) { return reference_reduce(c, W, me * n + i, salt); });
      break;
    case Coll::all_reduce:
    case Coll::reduce:
      expected = make_buffer(c.dtype, n, [&](std::size_t i) { return reference_reduce(c, W, i, salt); });
      check_output = c.coll == Coll::all_reduce || me == root;
      break;
  }
  // Rank `me`'s input (all_gather: its piece; reduce_scatter: all W blocks).
  const std::vector<std::byte> mine = make_buffer(c.dtype, in_n, [&](std::size_t i) { return input(me, i); });

  // buf: the send buffer (in place: the one buffer); out: recv when out of place. 0xA5 sentinels.
  const std::size_t buf_n = c.in_place ? std::max(in_n, out_n) : in_n;
  std::vector<std::byte> buf(std::max<std::size_t>(buf_n, 1) * es, std::byte{0xA5});
  std::vector<std::byte> out(c.in_place ? es : std::max<std::size_t>(out_n, 1) * es, std::byte{0xA5});
  std::byte* send = buf.data() + in_at * es;
  std::byte* recv = c.in_place ? buf.data() : out.data();
  if (c.in_place && c.coll == Coll::reduce_scatter) recv = buf.data() + me * n * es;
  if (c.in_place && c.coll == Coll::all_gather) recv = buf.data();

  std::unique_ptr<Stream> stream = c.stream ? host_device().create_stream("comm-test") : nullptr;
  std::vector<std::byte> result(std::max<std::size_t>(out_n, 1) * es, std::byte{0x5A});
  const std::size_t in_bytes = mine.size(), out_bytes = out_n * es;
  if (stream) {
    // Input copied in, output copied out on the same stream: wrong unless the collective runs between.
    stream->copy_async(send, mine.data(), in_bytes, CopyKind::host_to_device);
  } else if (in_bytes) {
    std::memcpy(send, mine.data(), in_bytes);
  }
  switch (c.coll) {
    case Coll::broadcast:
      comm.broadcast(send, recv, n, c.dtype, root, stream.get());
      break;
    case Coll::all_gather:
      comm.all_gather(send, recv, n, c.dtype, stream.get());
      break;
    case Coll::reduce_scatter:
      comm.reduce_scatter(send, recv, n, c.dtype, c.op, stream.get());
      break;
    case Coll::all_reduce:
      comm.all_reduce(send, recv, n, c.dtype, c.op, stream.get());
      break;
    case Coll::reduce:
      comm.reduce(send, recv, n, c.dtype, c.op, root, stream.get());
      break;
  }
  if (stream) {
    stream->copy_async(result.data(), recv, out_bytes, CopyKind::device_to_host);
    stream->synchronize();
  } else if (out_bytes) {
    std::memcpy(result.data(), recv, out_bytes);
  }

  std::size_t bad = 0;
  if (check_output) {
    for (std::size_t i = 0; i < out_n; ++i) {
      if (std::memcmp(result.data() + i * es, expected.data() + i * es, es) == 0) continue;
      if (++bad <= 3)
        ADD_FAILURE() << coll_name(c.coll) << " rank " << me << " of " << W << ", element " << i << ": got "
                      << read_value(c.dtype, result.data(), i) << ", expected "
                      << read_value(c.dtype, expected.data(), i);
    }
  } else if (!c.in_place) {
    // reduce: recv is the root's alone; the others' stays untouched.
    for (std::size_t i = 0; i < out_n * es; ++i) bad += out[i] != std::byte{0xA5};
    if (bad) ADD_FAILURE() << "reduce: rank " << me << " (not the root) had its recv written";
  }
  return bad;
}

}  // namespace strata::testing
