// The training loop pieces: one micro-batch's forward and backward, and the optimizer step.
//
// Note [The optimizer step]: step() (1) waits for the gradients still travelling off the device, (2) sums
// the squared norm and checks for overflow chunk by chunk (cpu_optim::grad_stats; the sum is all-reduced
// across ranks), (3) lets the loss scaler decide whether the step applies, (4) updates each chunk as its
// route says (the Updater, engine_update.cpp) — in place where the master and states live in addressable
// memory (the device on the host backend, or pinned host memory), on the device by the compute interface,
// or through the NVMe swap pipeline — writing the new working params to their home, and (5) drops the
// gathered chunks, now stale. The parts it drives: Note [Engine parts] in engine_impl.h.
//
// Note [Optimizer overlap] (engine_overlap.cpp): with the CPU optimizer, a chunk's update may already have
// been made during backward, assuming the step applies unclipped; step() keeps it when that held and
// undoes it (a rollback) before updating as below when it did not.
//
// Note [Loss weighting]: the model's loss of a micro-batch is the mean over its n counted targets (a
// target below 0 — the loss mask's -100 — does not count), and the reduce-scatter sums the ranks'
// gradients. How the step's micro-batches are weighed is strata.loss_weighting's choice:
//   tokens (the default; transformers' Trainer since its gradient-accumulation fix): the step's loss is
//     the mean over every counted target of every micro-batch on every rank, N of them. train_batch reads
//     the step's micro-batches first, sums their n over the ranks, and backward scales micro-batch i's
//     gradients by loss_scale · n_i / N, computed as loss_scale / (N / n_i): when every n_i is equal,
//     N / n_i is exactly accumulation steps × world (integers in double), so the factor is bit for bit the
//     one below and the two weightings agree exactly. n_i = 0 adds nothing (factor 0).
//   micro_batches (a plain DeepSpeed loop): loss_scale / (accumulation steps × world), the mean of the
//     micro-batches' means, each micro-batch weighing the same whatever its n.
// The step's reported loss follows: Σ n_i · loss_i / N over the ranks (each rank's terms summed in order,
// then the ranks' in rank order, so one rank with accumulation k and k ranks with accumulation 1 sum the
// same micro-batches in the same order) when every backward of the step on every rank was given N and the
// n_i differ;
// otherwise the mean of the means as before (equal n_i: the same value, computed as it always was, so
// losses stay bit-identical to runs before the weighting existed). Engine::backward without a count (the
// Python binding when no num_items_in_batch is given) weighs as micro_batches does.
//
// Note [Dropout keys in the engine]: every training forward is armed (TrainableModel::arm_dropout, Note
// [Dropout keys] in model/trainable.h) with a key of its position in the run, hashed from strata.seed, the
// step it computes (global_step + 1, skipped steps counted as DeepSpeed counts them), its micro-batch in
// that step (the backwards since the last step: a forward abandoned and run again draws the same masks)
// and the rank — never from a counter of this process. Placement and overlap change none of the four, so
// their losses stay bit-identical with dropout; a checkpoint is taken between steps, so a resumed run's
// forwards have the positions, and the masks, of the uninterrupted run's. Ranks draw different masks, as
// DDP's ranks do: with dropout, N ranks match one rank that sees the same samples to statistics only.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <utility>
#include <vector>

#include "core/log.h"
#include "model/dtype.h"
#include "zero3/engine_impl.h"

namespace strata::zero3 {

using detail::cat;

void Engine::Impl::settle_backward() {
  if (!backward_end || backward_end->query()) return;
  const auto t0 = Clock::now();
  backward_end->synchronize();
  times.backward += seconds_since(t0);
}

namespace {

// Note [Dropout keys in the engine].
std::uint64_t dropout_key(std::int64_t seed, std::int64_t step, int micro_step, int rank) {
  // "loradrop": keys apart from the seed's other uses (initialisation, data order).
  constexpr std::uint64_t kDropout = 0x6C6F7261'64726F70ull;
  std::uint64_t k = kernels::dropout_key(std::uint64_t(seed), kDropout);
  for (std::uint64_t v : {std::uint64_t(step), std::uint64_t(micro_step), std::uint64_t(rank)})
    k = kernels::dropout_key(k, v);
  return k;
}

}  // namespace

BackwardStart Engine::Impl::backward_start() const {
  return {.ends_step = micro_steps + 1 >= cfg.gradient_accumulation_steps,
          .lr = sched.lr(),
          .unclipped_factor = float(1.0 / scaler.scale()),  // grad_scale's factor when clipping does not fire
          .step_no = applied_steps + 1};
}

StepResult Engine::Impl::step() {
  STRATA_CHECK(!cache.in_pass(), "zero3: step() inside a forward/backward pass");
  settle_backward();
  const auto t1 = Clock::now();
  settle_for_step();
  tm->set_step(global_step + 1, tiering::Phase::optimizer);

  // Global norm and overflow, chunk by chunk in a fixed order.
  double sum_sq = 0;
  bool finite = true;
  grads.stats(sum_sq, finite);  // over every rank's shards

  StepResult r;
  r.loss_scale = scaler.scale();
  r.lr = sched.lr();
  r.applied = step_applies(finite);
  if (r.applied) {
    const GradScale gs = grad_scale(sum_sq, r.loss_scale, cfg.gradient_clipping);
    r.grad_norm = gs.norm;
    apply_update(gs, r.lr);
  } else {
    overlap.undo(UndoAs::rollback);
    r.grad_norm = finite ? std::sqrt(sum_sq) / r.loss_scale : std::numeric_limits<double>::infinity();
    ++skipped;
  }
  grads.new_step();
  ++global_step;
  times.optimizer += seconds_since(t1);
  close_step(r);
  tm->set_step(global_step, tiering::Phase::idle);
  return r;
}

void Engine::Impl::settle_for_step() {
  try {
    grads.sync();
  } catch (...) {
    overlap.undo(UndoAs::cancellation);  // updates made from gradients that may not have arrived
    throw;
  }
  {
    const WaitTimer tw(*compute_stream);
    overlap.settle_all();  // the last step's updates left to the worker (chunks no backward reached)
    overlap.wait();  // the updates made during backward (Note [Optimizer overlap] in engine_overlap.cpp)
    times.wait += tw.idle_seconds();
  }
  // No gather still reads the working params the update writes (the compute stream, not the host, waited
  // for the gathers it used; one prefetched but not used may still be running).
  gather_stream->synchronize();
}

bool Engine::Impl::step_applies(bool finite) {
  if (scaler.enabled()) return scaler.update(!finite);
  if (!finite)
    STRATA_LOG_WARN("zero3: non-finite gradients at step ", global_step + 1,
                    "; the step is skipped (lower the learning rate or enable gradient_clipping)");
  return finite;
}

void Engine::Impl::apply_update(const GradScale& gs, double lr) {
  const std::int64_t step_no = applied_steps + 1;
  // The updates made during backward assumed this factor, rate and step; otherwise they are undone.
  if (!overlap.assumed(gs.factor, lr, step_no)) overlap.undo(UndoAs::rollback);
  overlap.clipped(gs.clipped);
  // Those made during backward stand; the others are made now (updater: each as its route says) or, where
  // the route defers them, left to the overlap's worker, which makes them while the next forward starts.
  bool kept = false;
  std::vector<int> now, later;
  for (const auto& g : groups)
    for (int c : g) {
      if (overlap.done(std::size_t(c))) {
        overlap.keep(std::size_t(c));
        kept = true;
      } else {
        (slots[std::size_t(c)].route.defer ? later : now).push_back(c);  // set only when the overlap runs
      }
    }
  updater.update(now, lr, gs.factor, step_no);
  overlap.defer(later, lr, gs.factor, step_no);
  if (kept) overlap.count_kept_step();
  ++applied_steps;
  sched.step();
  const auto any_route = [&](bool UpdateRoute::*what) {
    return std::any_of(slots.begin(), slots.end(), [&](const ChunkSlot& s) { return s.route.*what; });
  };
  if (any_route(&UpdateRoute::gathers_wait_update)) {
    // Gathers read the new working params after the compute stream has written them.
    if (!updated) updated = dev->create_event();
    compute_stream->record(*updated);
    gather_stream->wait(*updated);
  }
  // Stages 1 and 2: each rank updated its slice of every chunk's working params; the all-gather (on the
  // gather stream, before any later gather reads them) gives every rank all of them.
  if (any_route(&UpdateRoute::all_gather_after_step)) cache.all_gather_params();
  cache.drop_all_gathered();
}

void Engine::Impl::close_step(StepResult& r) {
  r.step = global_step;
  // Every rank's micro-batches: the mean of world x micro_steps losses, and their tokens.
  const double losses = comm->all_reduce_sum(loss_sum);  // one rank: loss_sum
  r.loss = micro_steps > 0 ? losses / (double(micro_steps) * world) : 0.0;
  r.tokens = std::int64_t(comm->all_reduce_sum(double(tokens)));
  // Note [Loss weighting]: the mean over the counted targets where the backwards weighed by them.
  const StepCounts all = step_counts();
  r.counted = all.counted;
  if (all.weighed_by_count && all.counted > 0 && all.least != all.most)
    r.loss = all.counted_loss_sum / double(all.counted);
  times.wait += cache.take_wait() + grads.take_wait() + updater.take_wait();  // the parts' share
  r.times = times;
  r.times.total = times.forward + times.backward + times.optimizer;
  micro_steps = 0;
  loss_sum = 0;
  tokens = 0;
  counted_loss_sum = 0;
  counted = 0;
  counted_min = INT64_MAX;
  counted_max = INT64_MIN;
  weighed_by_count = true;
  times = {};
}

Engine::Impl::StepCounts Engine::Impl::step_counts() {
  StepCounts c{.counted_loss_sum = counted_loss_sum,
               .counted = counted,
               .least = counted_min,
               .most = counted_max,
               .weighed_by_count = weighed_by_count && micro_steps > 0};
  // Every rank's, summed in rank order (Note [Loss weighting]); one rank's: its own.
  struct Mine {
    double counted_loss_sum;
    std::int64_t counted, least, most, weighed;
  };
  const Mine mine{c.counted_loss_sum, c.counted, c.least, c.most, c.weighed_by_count ? 1 : 0};
  std::vector<Mine> every(static_cast<std::size_t>(world));
  comm->host_all_gather(&mine, every.data(), sizeof(Mine));
  c = {.counted_loss_sum = 0, .counted = 0, .least = INT64_MAX, .most = INT64_MIN, .weighed_by_count = true};
  for (const Mine& m : every) {
    c.counted_loss_sum += m.counted_loss_sum;
    c.counted += m.counted;
    c.least = std::min(c.least, m.least);
    c.most = std::max(c.most, m.most);
    c.weighed_by_count = c.weighed_by_count && m.weighed != 0;
  }
  return c;
}

// ------------------------------------------------------------------------------------------ public API

void Engine::begin_pass() {
  Impl& im = *impl_;
  STRATA_CHECK(!im.cache.in_pass(), "zero3: begin_pass inside a pass");  // before anything is undone
  im.dev->bind_thread();                  // Note [thread device] in core/device.h: whichever thread trains
  im.overlap.undo(UndoAs::cancellation);  // a forward before step() sees the params of the last step
  im.tm->set_step(im.global_step + 1, tiering::Phase::forward);
  // Another micro-batch of this step follows: its pass uses the same parameters, so chunks may stay
  // gathered from one to the next where the cache has room (Note [Reuse across passes] in prefetch.h).
  im.cache.begin_pass(!im.backward_start().ends_step);
}

void Engine::end_pass() {
  impl_->cache.end_pass();
}

float Engine::forward(model::TrainableModel& model, const std::int32_t* inputs, const std::int32_t* targets,
                      int B, int T, const std::int32_t* positions) {
  Impl& im = *impl_;
  STRATA_CHECK(!im.forward_open, "zero3: forward while the last forward's backward is pending");
  begin_pass();
  im.settle_backward();
  try {
    const auto t0 = Clock::now();
    model.arm_dropout(dropout_key(im.cfg.strata.seed, im.global_step + 1, im.micro_steps, im.comm->rank()));
    im.training_forward = true;
    im.forward_loss = model.forward(*this, inputs, targets, B, T, positions);
    im.training_forward = false;
    im.times.forward += seconds_since(t0);
  } catch (...) {
    im.training_forward = false;
    im.abandon_pass();
    throw;
  }
  im.forward_open = true;
  im.forward_tokens = std::int64_t(B) * T;
  std::int64_t n = 0;
  if (targets != nullptr)
    for (std::int64_t i = 0; i < im.forward_tokens; ++i) n += targets[i] >= 0 ? 1 : 0;
  im.forward_counted = n;
  return im.forward_loss;
}

void Engine::backward(model::TrainableModel& model, std::optional<std::int64_t> step_counted) {
  Impl& im = *impl_;
  STRATA_CHECK(im.forward_open, "zero3: backward without a forward");
  const std::int64_t n = im.forward_counted;
  if (step_counted && *step_counted < n)
    throw ConfigError(cat("backward: the step's counted targets (num_items_in_batch) are ", *step_counted,
                          ", fewer than the ", n,
                          " this micro-batch counts alone; give the targets that count (labels >= 0, after "
                          "the shift) summed over every micro-batch of the optimizer step on every rank"));
  // Note [Loss weighting]: the mean over the step's micro-batches on every rank (the reduce-scatter sums
  // the ranks'), each weighing the same, or the one over the step's counted targets.
  const double scale = im.scaler.scale();
  double factor = scale / (double(im.cfg.gradient_accumulation_steps) * im.world);
  if (step_counted) factor = n == 0 ? 0.0 : scale / (double(*step_counted) / double(n));
  im.dev->bind_thread();
  im.forward_open = false;
  im.tm->set_step(im.global_step + 1, tiering::Phase::backward);
  const BackwardStart start = im.backward_start();
  im.grads.begin_backward(start);
  try {
    const auto t0 = Clock::now();
    im.overlap.begin_backward(start);
    model.backward(*this, float(factor));
    // The step's last backward: what is still accumulating on the device crosses now (a chunk whose last
    // hand-off was not known to be its last: the first step's).
    if (start.ends_step) im.grads.flush_accumulators();
    if (!im.backward_end) im.backward_end = im.dev->create_event();
    im.compute_stream->record(*im.backward_end);
    im.times.backward += seconds_since(t0);
  } catch (...) {
    im.overlap.end_backward(BackwardEnd::failed);
    im.checkpoints.reset();
    end_pass();
    throw;
  }
  im.grads.end_backward();
  im.overlap.end_backward(BackwardEnd::completed);
  end_pass();
  im.loss_sum += im.forward_loss;
  ++im.micro_steps;
  im.tokens += im.forward_tokens;
  im.counted_loss_sum += double(im.forward_loss) * double(n);  // exact: a float times n < 2^29
  im.counted += n;
  im.counted_min = std::min(im.counted_min, n);
  im.counted_max = std::max(im.counted_max, n);
  im.weighed_by_count = im.weighed_by_count && step_counted.has_value();
}

void Engine::abandon_forward() {
  Impl& im = *impl_;
  STRATA_CHECK(im.forward_open, "zero3: abandon_forward without a pending forward");
  im.forward_open = false;
  im.abandon_pass();
}

void Engine::Impl::abandon_pass() {
  checkpoints.reset();
  cache.abandon_pass();
  tm->set_step(global_step, tiering::Phase::idle);
}

bool Engine::forward_pending() const {
  return impl_->forward_open;
}

int Engine::pending_micro_steps() const {
  return impl_->micro_steps;
}

float Engine::forward_backward(model::TrainableModel& model, const model::Batch& batch,
                               std::optional<std::int64_t> step_counted) {
  const float loss = forward(model, batch.inputs.data(), batch.targets.data(), batch.rows, batch.seq_len,
                             batch.positions.empty() ? nullptr : batch.positions.data());
  backward(model, step_counted);
  return loss;
}

StepResult Engine::train_batch(model::TrainableModel& model, model::DataLoader& data) {
  Impl& im = *impl_;
  const std::int64_t accumulation = im.cfg.gradient_accumulation_steps;
  if (im.cfg.strata.loss_weighting == StrataConfig::LossWeighting::micro_batches) {
    for (std::int64_t i = 0; i < accumulation; ++i) forward_backward(model, data.next());
    return step();
  }
  // Note [Loss weighting]: the step's counted targets on every rank, known before the first backward.
  std::vector<model::Batch> batches;
  batches.reserve(std::size_t(accumulation));
  std::int64_t mine = 0;
  for (std::int64_t i = 0; i < accumulation; ++i) {
    batches.push_back(data.next());
    mine += batches.back().counted;
  }
  const std::int64_t total = std::int64_t(im.comm->all_reduce_sum(double(mine)));  // exact below 2^53
  for (const model::Batch& b : batches) forward_backward(model, b, total);
  return step();
}

void Engine::read_params(int id, float* out) {
  Impl& im = *impl_;
  im.dev->bind_thread();
  const ChunkSlot& s = im.slots.at(std::size_t(id));
  im.overlap.settle_all();
  im.overlap.undo(UndoAs::cancellation);  // the params of the last step
  std::memset(out, 0, s.numel * sizeof(float));
  im.gather_stream->synchronize();  // replicated params: the step's all-gather has landed
  const std::size_t n = s.param_numel, at = s.route.all_gather ? s.shard.offset : 0;
  im.with_host_copy(s.tensors.param, [&](const void* p) {
    if (s.nf4)  // the whole chunk, dequantised as a gather does (in fp32)
      model::unpack_nf4(*s.nf4, p, s.nf4_offsets, out);
    else
      model::convert_to_f32(im.working_dtype, p, n, out + at);
  });
  // The other ranks' shards, in place, in host memory (collective: every rank reads the same chunk).
  if (s.route.all_gather) im.comm->host_all_gather(out + s.shard.offset, out, s.shard.numel * sizeof(float));
}

std::vector<float> Engine::master_params(int id) {
  Impl& im = *impl_;
  im.dev->bind_thread();
  const ChunkSlot& s = im.slots.at(std::size_t(id));
  im.overlap.settle_all();
  im.overlap.undo(UndoAs::cancellation);
  std::vector<float> out(s.shard.numel);
  if (s.nf4) {  // an NF4 base's chunk: its values are the dequantised ones
    std::vector<float> whole(s.numel);
    im.with_host_copy(s.tensors.param,
                      [&](const void* p) { model::unpack_nf4(*s.nf4, p, s.nf4_offsets, whole.data()); });
    std::copy_n(whole.begin() + std::ptrdiff_t(s.shard.offset), out.size(), out.begin());
    return out;
  }
  if (!s.route.trains) {  // frozen: no master; its working params are its values
    im.with_host_copy(s.tensors.param, [&](const void* p) {
      model::convert_to_f32(im.working_dtype,
                            static_cast<const char*>(p) + s.param_offset * im.working_dtype_bytes(),
                            out.size(), out.data());
    });
    return out;
  }
  im.with_host_copy(s.tensors.master,
                    [&](const void* p) { std::memcpy(out.data(), p, out.size() * sizeof(float)); });
  return out;
}

void Engine::read_masters(int id, float* out) {
  Impl& im = *impl_;
  const ChunkSlot& s = im.slots.at(std::size_t(id));
  const std::vector<float> mine = master_params(id);
  std::memset(out, 0, s.numel * sizeof(float));
  std::memcpy(out + s.shard.offset, mine.data(), mine.size() * sizeof(float));
  if (im.world > 1) im.comm->host_all_gather(out + s.shard.offset, out, s.shard.numel * sizeof(float));
}

void Engine::set_base(nlohmann::json identity) {
  impl_->base_identity = std::move(identity);
}

}  // namespace strata::zero3
