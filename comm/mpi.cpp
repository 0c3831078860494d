// The MPI communicator: every collective of comm/comm.h over host-addressable buffers (the host backend's
// "device" memory is ordinary host memory, so MPI reads and writes it directly).
//
// Note [Deterministic MPI reductions]: MPI fixes neither the order nor the association in which a
// reduction combines the ranks' values, and a user-defined MPI_Op on bf16/fp16 buffers would round
// after every pairwise step. So reduce_scatter / all_reduce / reduce do not use MPI's reductions:
//   1. exchange: rank p sends block q of its input to rank q (point-to-point, every pair at once);
//   2. fold: rank q computes block q as the left fold over ranks 0, 1, ..., N-1 in fp32
//      (((x0 op x1) op x2) ...), divides by N for avg, and rounds once to the buffer's dtype;
//   3. all_reduce sends each reduced block to every rank, reduce to the root.
// Each element is computed on exactly one rank, so the result is identical on every rank and the same
// from run to run, and it is the value a test computes locally in rank order. The traffic is that of a
// direct reduce-scatter ((N-1)/N of the buffer out and in per rank); the scratch is one block per rank.
// max/min propagate NaN. Reductions take fp32, bf16 and fp16; broadcast and all_gather take every dtype.
//
// Note [MPI on a stream]: with a Stream the collective is enqueued as stream->host_fn(...), so it runs on
// the stream's worker thread in order with the stream's other work; an MPI error then surfaces at the
// stream's next synchronize(). The communicator waits in its destructor for the calls it enqueued.
#include <mpi.h>

#include <algorithm>
#include <atomic>
#include <climits>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <mutex>
#include <vector>

#include "comm/comm.h"
#include "comm/mpi_impl.h"
#include "core/error.h"

namespace strata::comm::detail {
namespace {

std::atomic<std::size_t> g_max_count{std::size_t(INT_MAX)};
std::atomic<int> g_pending{0};
std::once_flag g_init_once;

void finalize_at_exit() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (finalized) return;
  if (const int n = g_pending.load(); n > 0) {
    std::fprintf(stderr,
                 "strata: MPI_Finalize skipped at exit: %d collective(s) enqueued on streams have not "
                 "finished. Synchronise the streams (and destroy the communicators) before exiting.\n",
                 n);
    return;
  }
  MPI_Finalize();
}

const char* thread_level_name(int level) {
  switch (level) {
    case MPI_THREAD_SINGLE:
      return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED:
      return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED:
      return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE:
      return "MPI_THREAD_MULTIPLE";
  }
  return "?";
}

}  // namespace

void mpi_check(int rc, const char* call, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  if (MPI_Error_string(rc, text, &len) != MPI_SUCCESS) len = 0;
  throw BackendError(::strata::detail::cat("MPI ", what, ": ", call, " failed: ", std::string(text, len),
                                           " (error ", rc, ")"));
}

void mpi_init_once() {
  std::call_once(g_init_once, [] {
    int initialised = 0, finalized = 0;
    STRATA_MPI_CHECK("init", MPI_Initialized(&initialised));
    STRATA_MPI_CHECK("init", MPI_Finalized(&finalized));
    if (finalized) throw BackendError("MPI init: MPI was already finalised in this process");
    int provided = MPI_THREAD_SINGLE;
    if (!initialised) {
      STRATA_MPI_CHECK("init", MPI_Init_thread(nullptr, nullptr, MPI_THREAD_MULTIPLE, &provided));
      std::atexit(finalize_at_exit);
    } else {
      STRATA_MPI_CHECK("init", MPI_Query_thread(&provided));
    }
    if (provided < MPI_THREAD_MULTIPLE)
      throw ConfigError(::strata::detail::cat(
          "MPI provides only ", thread_level_name(provided),
          "; Strata drives its communicators from several threads and needs MPI_THREAD_MULTIPLE. Use an "
          "MPI built with thread support (Debian's libopenmpi-dev is), and do not restrict it (e.g. Open "
          "MPI's --mca mpi_thread_multiple 0)."));
  });
}

bool mpi_active() {
  int initialised = 0, finalized = 0;
  MPI_Initialized(&initialised);
  MPI_Finalized(&finalized);
  return initialised && !finalized;
}

void mpi_pending_add(int delta) {
  g_pending.fetch_add(delta);
}

void set_mpi_max_message_count(std::size_t elements) {
  STRATA_CHECK(elements >= 1 && elements <= std::size_t(INT_MAX), "MPI message count ", elements,
               " is not in 1..INT_MAX");
  g_max_count.store(elements);
}
std::size_t mpi_max_message_count() {
  return g_max_count.load();
}

namespace {

// Data movement does not look at the values: an unsigned integer type of the element's size.
MPI_Datatype move_type(DType t) {
  switch (dtype_bytes(t)) {
    case 1:
      return MPI_UINT8_T;
    case 2:
      return MPI_UINT16_T;
    default:
      return MPI_UINT32_T;
  }
}

const std::byte* at(const void* p, std::size_t elements, std::size_t esize) {
  return static_cast<const std::byte*>(p) + elements * esize;
}
std::byte* at(void* p, std::size_t elements, std::size_t esize) {
  return static_cast<std::byte*>(p) + elements * esize;
}

// [a, a + an) and [b, b + bn) share a byte.
bool overlap(const void* a, std::size_t an, const void* b, std::size_t bn) {
  const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
  return an && bn && x < y + bn && y < x + an;
}

// ---- the fold (Note [Deterministic MPI reductions]) ----

template <DType D>
float load(const void* p, std::size_t i) {
  if constexpr (D == DType::fp32) return static_cast<const float*>(p)[i];
  if constexpr (D == DType::bf16) return bf16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
  if constexpr (D == DType::fp16) return f16_to_f32(static_cast<const std::uint16_t*>(p)[i]);
}
template <DType D>
void store(void* p, std::size_t i, float v) {
  if constexpr (D == DType::fp32) static_cast<float*>(p)[i] = v;
  if constexpr (D == DType::bf16) static_cast<std::uint16_t*>(p)[i] = f32_to_bf16(v);
  if constexpr (D == DType::fp16) static_cast<std::uint16_t*>(p)[i] = f32_to_f16(v);
}

inline float combine(ReduceOp op, float a, float b) {
  switch (op) {
    case ReduceOp::sum:
    case ReduceOp::avg:
      return a + b;
    case ReduceOp::max:  // NaN propagates (the first one in rank order)
      return std::isnan(a) ? a : std::isnan(b) ? b : b > a ? b : a;
    case ReduceOp::min:
      return std::isnan(a) ? a : std::isnan(b) ? b : b < a ? b : a;
  }
  return a;
}

// out[i] = round(in[0][i] op in[1][i] op ... in[N-1][i]) (left fold in fp32; / N for avg). `out` may be
// one of the inputs: each element is read from every input before it is written.
template <DType D>
void fold_typed(ReduceOp op, const std::vector<const void*>& in, void* out, std::size_t n) {
  constexpr std::size_t kBlock = 1024;
  float acc[kBlock];
  const float world = float(in.size());
  for (std::size_t b = 0; b < n; b += kBlock) {
    const std::size_t m = std::min(kBlock, n - b);
    for (std::size_t i = 0; i < m; ++i) acc[i] = load<D>(in[0], b + i);
    for (std::size_t r = 1; r < in.size(); ++r) {
      if (op == ReduceOp::sum || op == ReduceOp::avg) {
        for (std::size_t i = 0; i < m; ++i) acc[i] += load<D>(in[r], b + i);
      } else {
        for (std::size_t i = 0; i < m; ++i) {
          acc[i] = combine(op, acc[i], load<D>(in[r], b + i));
        }
      }
    }
    if (op == ReduceOp::avg)
      for (std::size_t i = 0; i < m; ++i) acc[i] /= world;
    for (std::size_t i = 0; i < m; ++i) store<D>(out, b + i, acc[i]);
  }
}

void fold(DType t, ReduceOp op, const std::vector<const void*>& in, void* out, std::size_t n) {
  switch (t) {
    case DType::fp32:
      return fold_typed<DType::fp32>(op, in, out, n);
    case DType::bf16:
      return fold_typed<DType::bf16>(op, in, out, n);
    case DType::fp16:
      return fold_typed<DType::fp16>(op, in, out, n);
    default:
      break;
  }
  STRATA_CHECK(false, "reduction over ", dtype_name(t), " buffers");
}

// One rank's traffic with one peer in an exchange: `send_n` elements to it, `recv_n` from it.
struct PeerMessage {
  const void* send = nullptr;
  std::size_t send_n = 0;
  void* recv = nullptr;
  std::size_t recv_n = 0;
};

class MpiCommunicator final : public Communicator {
 public:
  explicit MpiCommunicator(MPI_Comm comm) : comm_(comm) {
    STRATA_MPI_CHECK("communicator", MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN));
    STRATA_MPI_CHECK("communicator", MPI_Comm_rank(comm_, &rank_));
    STRATA_MPI_CHECK("communicator", MPI_Comm_size(comm_, &world_));
  }
  ~MpiCommunicator() override {
    {
      std::unique_lock<std::mutex> lk(m_);
      idle_.wait(lk, [&] { return pending_ == 0; });
    }
    if (mpi_active()) MPI_Comm_free(&comm_);  // best effort: a destructor cannot throw
  }

  int rank() const override { return rank_; }
  int world_size() const override { return world_; }
  const char* name() const override { return "mpi"; }

  void broadcast(const void* send, void* recv, std::size_t count, DType dtype, int root,
                 Stream* stream) override {
    check_root("broadcast", root, world_);
    if (count == 0) return;
    STRATA_CHECK(recv && (rank_ != root || send), "broadcast: null buffer");
    run(stream, [=, this] {
      const std::size_t es = dtype_bytes(dtype);
      if (rank_ == root && send != recv) std::memmove(recv, send, count * es);
      for_pieces(count, [&](std::size_t off, int n) {
        STRATA_MPI_CHECK("broadcast", MPI_Bcast(at(recv, off, es), n, move_type(dtype), root, comm_));
      });
    });
  }

  void all_gather(const void* send, void* recv, std::size_t send_count, DType dtype,
                  Stream* stream) override {
    if (send_count == 0) return;
    STRATA_CHECK(send && recv, "all_gather: null buffer");
    const std::size_t es = dtype_bytes(dtype);
    const void* mine = at(recv, std::size_t(rank_) * send_count, es);
    const bool in_place = send == mine;
    STRATA_CHECK(in_place || !overlap(send, send_count * es, recv, world_ * send_count * es),
                 "all_gather: send overlaps recv but is not its slot recv + rank * send_count (the in-place "
                 "form)");
    run(stream, [=, this] {
      if (send_count <= mpi_max_message_count()) {
        STRATA_MPI_CHECK("all_gather",
                         MPI_Allgather(in_place ? MPI_IN_PLACE : send, int(send_count), move_type(dtype),
                                       recv, int(send_count), move_type(dtype), comm_));
        return;
      }
      if (!in_place) std::memcpy(const_cast<void*>(mine), send, send_count * es);
      std::vector<PeerMessage> msgs(world_);
      for (int p = 0; p < world_; ++p)
        msgs[p] = {mine, send_count, at(recv, std::size_t(p) * send_count, es), send_count};
      exchange("all_gather", dtype, msgs);
    });
  }

  void reduce_scatter(const void* send, void* recv, std::size_t recv_count, DType dtype, ReduceOp op,
                      Stream* stream) override {
    check_reducible("reduce_scatter", dtype);
    if (recv_count == 0) return;
    const std::size_t es = dtype_bytes(dtype);
    STRATA_CHECK(send && recv, "reduce_scatter: null buffer");
    STRATA_CHECK(
        recv == at(send, std::size_t(rank_) * recv_count, es) ||
            !overlap(send, world_ * recv_count * es, recv, recv_count * es),
        "reduce_scatter: recv overlaps send but is not send + rank * recv_count (the in-place form)");
    run(stream, [=, this] {
      std::vector<std::size_t> off(world_), len(world_, recv_count);
      for (int p = 0; p < world_; ++p) off[p] = std::size_t(p) * recv_count;
      reduce_blocks("reduce_scatter", send, recv, off, len, dtype, op);
    });
  }

  void all_reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op,
                  Stream* stream) override {
    check_reducible("all_reduce", dtype);
    if (count == 0) return;
    const std::size_t es = dtype_bytes(dtype);
    STRATA_CHECK(send && recv, "all_reduce: null buffer");
    STRATA_CHECK(send == recv || !overlap(send, count * es, recv, count * es),
                 "all_reduce: send and recv overlap but are not the same buffer (the in-place form)");
    run(stream, [=, this] {
      std::vector<std::size_t> off, len;
      split_blocks(count, &off, &len);
      void* mine = at(recv, off[rank_], es);
      reduce_blocks("all_reduce", send, mine, off, len, dtype, op);
      std::vector<PeerMessage> msgs(world_);
      for (int p = 0; p < world_; ++p) msgs[p] = {mine, len[rank_], at(recv, off[p], es), len[p]};
      exchange("all_reduce", dtype, msgs);
    });
  }

  void reduce(const void* send, void* recv, std::size_t count, DType dtype, ReduceOp op, int root,
              Stream* stream) override {
    check_reducible("reduce", dtype);
    check_root("reduce", root, world_);
    if (count == 0) return;
    const std::size_t es = dtype_bytes(dtype);
    STRATA_CHECK(send && (rank_ != root || recv), "reduce: null buffer");
    STRATA_CHECK(rank_ != root || send == recv || !overlap(send, count * es, recv, count * es),
                 "reduce: send and recv overlap but are not the same buffer (the in-place form)");
    run(stream, [=, this] {
      std::vector<std::size_t> off, len;
      split_blocks(count, &off, &len);
      // The root folds its block straight into recv; the others into scratch past the exchange's.
      void* mine = rank_ == root ? at(recv, off[rank_], es) : block_scratch(len[rank_] * es);
      reduce_blocks("reduce", send, mine, off, len, dtype, op);
      std::vector<PeerMessage> msgs(world_);
      if (rank_ == root) {
        for (int p = 0; p < world_; ++p) msgs[p] = {nullptr, 0, at(recv, off[p], es), len[p]};
      } else {
        msgs[root] = {mine, len[rank_], nullptr, 0};
      }
      exchange("reduce", dtype, msgs);
    });
  }

  void barrier() override { STRATA_MPI_CHECK("barrier", MPI_Barrier(comm_)); }

  std::unique_ptr<Communicator> dup() override {
    MPI_Comm c = MPI_COMM_NULL;
    STRATA_MPI_CHECK("dup", MPI_Comm_dup(comm_, &c));
    return std::make_unique<MpiCommunicator>(c);
  }

  // Host memory is this communicator's memory: the collectives over bytes, on the calling thread.
  void host_all_gather(const void* send, void* recv, std::size_t bytes) override {
    all_gather(send, recv, bytes, DType::u8, nullptr);
  }
  void host_broadcast(void* buf, std::size_t bytes, int root) override {
    broadcast(buf, buf, bytes, DType::u8, root, nullptr);
  }

  double all_reduce_sum(double x) override { return mpi_scalar_sum(comm_, x); }
  bool all_reduce_and(bool x) override { return mpi_scalar_and(comm_, x); }
  double all_reduce_max(double x) override { return mpi_scalar_max(comm_, x); }

 private:
  // Now (no stream) or as a host function on the stream (Note [MPI on a stream]).
  void run(Stream* stream, std::function<void()> fn) {
    if (!stream) return fn();
    {
      std::lock_guard<std::mutex> lk(m_);
      ++pending_;
    }
    mpi_pending_add(1);
    stream->host_fn([this, fn = std::move(fn)] {
      struct Done {
        MpiCommunicator* c;
        ~Done() {
          mpi_pending_add(-1);
          std::lock_guard<std::mutex> lk(c->m_);
          if (--c->pending_ == 0) c->idle_.notify_all();
        }
      } done{this};
      fn();
    });
  }

  // Calls f(offset, n) for consecutive pieces of at most mpi_max_message_count() elements.
  template <class F>
  static void for_pieces(std::size_t count, F&& f) {
    const std::size_t max = mpi_max_message_count();
    for (std::size_t off = 0; off < count; off += max) f(off, int(std::min(max, count - off)));
  }

  // count elements in world_ blocks as equal as can be: the first count % world_ blocks one longer.
  void split_blocks(std::size_t count, std::vector<std::size_t>* off, std::vector<std::size_t>* len) const {
    off->resize(world_);
    len->resize(world_);
    const std::size_t base = count / world_, extra = count % world_;
    std::size_t o = 0;
    for (int p = 0; p < world_; ++p) {
      (*off)[p] = o;
      (*len)[p] = base + (std::size_t(p) < extra ? 1 : 0);
      o += (*len)[p];
    }
  }

  // Every pair at once: msgs[p] is what goes to and comes from rank p (msgs[rank_] is ignored). Messages
  // longer than mpi_max_message_count() go as consecutive pieces, matched in order (MPI's non-overtaking
  // rule for one source, tag and communicator).
  void exchange(const char* what, DType dtype, const std::vector<PeerMessage>& msgs) {
    const std::size_t es = dtype_bytes(dtype);
    const MPI_Datatype t = move_type(dtype);
    constexpr int kTag = 0x5354;  // "ST"
    std::vector<MPI_Request> reqs;
    for (int k = 1; k < world_; ++k) {
      const int p = (rank_ + world_ - k) % world_;  // receive from the left first ...
      const PeerMessage& m = msgs[p];
      for_pieces(m.recv_n, [&](std::size_t off, int n) {
        reqs.emplace_back();
        STRATA_MPI_CHECK(what, MPI_Irecv(at(m.recv, off, es), n, t, p, kTag, comm_, &reqs.back()));
      });
    }
    for (int k = 1; k < world_; ++k) {
      const int p = (rank_ + k) % world_;  // ... send to the right first
      const PeerMessage& m = msgs[p];
      for_pieces(m.send_n, [&](std::size_t off, int n) {
        reqs.emplace_back();
        STRATA_MPI_CHECK(what, MPI_Isend(at(m.send, off, es), n, t, p, kTag, comm_, &reqs.back()));
      });
    }
    STRATA_MPI_CHECK(what, MPI_Waitall(int(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE));
  }

  // Steps 1 and 2 of Note [Deterministic MPI reductions]: block p of `send` is [off[p], off[p] + len[p]);
  // this rank's reduced block goes to `out` (which may be its own block of send).
  void reduce_blocks(const char* what, const void* send, void* out, const std::vector<std::size_t>& off,
                     const std::vector<std::size_t>& len, DType dtype, ReduceOp op) {
    const std::size_t es = dtype_bytes(dtype), n = len[rank_];
    std::byte* tmp = exchange_scratch(world_ * n * es);  // slot p: rank p's block `rank_`
    std::vector<PeerMessage> msgs(world_);
    for (int p = 0; p < world_; ++p) msgs[p] = {at(send, off[p], es), len[p], tmp + p * n * es, n};
    exchange(what, dtype, msgs);
    std::vector<const void*> in(world_);
    for (int p = 0; p < world_; ++p) in[p] = p == rank_ ? at(send, off[rank_], es) : tmp + p * n * es;
    fold(dtype, op, in, out, n);
  }

  // Scratch kept between calls (a communicator runs one collective at a time): the exchange's receive
  // slots, then one block for reduce's non-roots.
  std::byte* exchange_scratch(std::size_t bytes) { return grow(&scratch_, &scratch_bytes_, bytes); }
  std::byte* block_scratch(std::size_t bytes) { return grow(&block_, &block_bytes_, bytes); }
  static std::byte* grow(std::unique_ptr<std::byte[]>* p, std::size_t* have, std::size_t bytes) {
    if (bytes > *have) {
      p->reset(new std::byte[bytes]);
      *have = bytes;
    }
    return p->get();
  }

  MPI_Comm comm_;
  int rank_ = 0, world_ = 1;
  std::unique_ptr<std::byte[]> scratch_, block_;
  std::size_t scratch_bytes_ = 0, block_bytes_ = 0;
  std::mutex m_;  // guards pending_
  std::condition_variable idle_;
  int pending_ = 0;  // calls enqueued on streams, not yet finished
};

}  // namespace

namespace {

std::vector<double> gather_scalar(MPI_Comm c, double x, const char* what) {
  int world = 1;
  STRATA_MPI_CHECK(what, MPI_Comm_size(c, &world));
  std::vector<double> all(static_cast<std::size_t>(world));
  STRATA_MPI_CHECK(what, MPI_Allgather(&x, 1, MPI_DOUBLE, all.data(), 1, MPI_DOUBLE, c));
  return all;
}

}  // namespace

double mpi_scalar_sum(MPI_Comm c, double x) {
  double s = 0;
  for (double v : gather_scalar(c, x, "all_reduce_sum")) s += v;
  return s;
}

bool mpi_scalar_and(MPI_Comm c, bool x) {
  bool r = true;
  for (double v : gather_scalar(c, x ? 1.0 : 0.0, "all_reduce_and")) r = r && v != 0;
  return r;
}

double mpi_scalar_max(MPI_Comm c, double x) {
  const std::vector<double> v = gather_scalar(c, x, "all_reduce_max");
  double m = v[0];
  for (double y : v) m = std::isnan(m) ? m : std::isnan(y) ? y : y > m ? y : m;
  return m;
}

std::unique_ptr<Communicator> make_mpi_communicator() {
  STRATA_CHECK(mpi_active(), "make_mpi_communicator before mpi_init_once");
  MPI_Comm c = MPI_COMM_NULL;
  STRATA_MPI_CHECK("communicator", MPI_Comm_dup(MPI_COMM_WORLD, &c));
  return std::make_unique<MpiCommunicator>(c);
}

std::unique_ptr<Communicator> make_mpi_communicator(MPI_Comm owned) {
  STRATA_CHECK(mpi_active(), "make_mpi_communicator before mpi_init_once");
  return std::make_unique<MpiCommunicator>(owned);
}

}  // namespace strata::comm::detail
