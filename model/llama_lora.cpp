// The decoder's LoRA products (model/lora.h, Note [LoRA as PEFT computes it]): s · B (A x) added to an
// adapted projection, its backward, the dropout on A's input, and the rows of the kept s · A x.
#include "core/error.h"
#include "kernels/ops.h"
#include "model/llama_impl.h"
#include "model/lora.h"

namespace strata::model {

using kernels::Tensor;

int LlamaModel::lora_slot(int site) const {
  const int slot = lora_slots_[size_t(site)];
  STRATA_CHECK(slot >= 0, "LoRA site ", site, " is not one of a ", cfg_.family, " block");
  return slot;
}

std::uint64_t LlamaModel::lora_mask_key(int site) const {
  return kernels::dropout_key(forward_key_, std::uint64_t(lora_layer_) << 8 | std::uint64_t(site));
}

Tensor LlamaModel::lora_input(Tensor x, int site, int N, int IC) {
  if (!dropping_) return x;
  const size_t n = size_t(N) * size_t(IC);
  const Tensor xd = lora_x_.t.slice(0, n);
  ops_->dropout(xd, x.slice(0, n), cfg_.lora.dropout, lora_mask_key(site));
  return xd;
}

Tensor LlamaModel::lora_t_rows(BlockActs& a, int site, int N) {
  const size_t R = size_t(cfg_.lora.r), all = size_t(B_) * size_t(T_);
  return a.lora_t.t.slice((size_t(lora_slot(site)) * all + lora_row0_) * R, size_t(N) * R);
}

void LlamaModel::lora_project_a(const ChunkView& ad, BlockActs& a, Tensor x, int proj, int N, Phase phase) {
  int64_t row = 0;
  const int site = lora_site_of_projection(cfg_, proj, &row);
  if (!ad.layout->has(lora_a_index(site))) return;
  const int R = int(cfg_.lora.r), IC = int(lora_site_in(cfg_, site));
  const Tensor t = lora_t_rows(a, site, N);
  const Tensor xin = lora_input(x, site, N, IC);
  kernels::Ops& o = *ops_;
  timed(
      "lora_A", phase, linear_flops(N, IC, R),
      [&] {
        o.linear_forward(t, xin, weight(ad, lora_a_index(site)), N, IC, R);
        o.scale(t, cfg_.lora.scale());
      },
      N, IC, R);
}

void LlamaModel::lora_forward(const ChunkView& ad, BlockActs& a, Tensor out, Tensor x, int proj, int N,
                              int OC, Phase phase) {
  int64_t row = 0;
  const int site = lora_site_of_projection(cfg_, proj, &row);
  if (!ad.layout->has(lora_a_index(site))) return;  // this block does not adapt the site
  const int R = int(cfg_.lora.r);
  kernels::Ops& o = *ops_;
  const Tensor t = lora_t_rows(a, site, N);
  if (row == 0) lora_project_a(ad, a, x, proj, N, phase);  // s · A x, kept for the site's parts and backward
  const Tensor b = weight(ad, lora_b_index(site)).slice(size_t(row) * size_t(R), size_t(OC) * size_t(R));
  const Tensor u = lora_u_.t.slice(0, size_t(N) * size_t(OC));
  timed(
      "lora_B", phase, linear_flops(N, R, OC),
      [&] {
        o.linear_forward(u, t, b, N, R, OC);
        o.residual_forward(out, out, u);
      },
      N, R, OC);
}

void LlamaModel::lora_backward(const ChunkView& ad, float* ag, BlockActs& a, Tensor dx, Tensor dout, Tensor x,
                               int proj, int N, int OC) {
  int64_t row = 0;
  const int site = lora_site_of_projection(cfg_, proj, &row);
  if (!ad.layout->has(lora_a_index(site))) return;
  const int R = int(cfg_.lora.r), IC = int(lora_site_in(cfg_, site));
  const Phase ph = Phase::backward;
  kernels::Ops& o = *ops_;
  const Tensor t = lora_t_rows(a, site, N);
  const Tensor dt = lora_dt_.t.slice(0, size_t(N) * size_t(R));
  // The site's parts run in row order in backward as in forward (q, k, v; gate, up): the first zeroes the
  // gradient of s · A x, each adds its share, the last takes it through A.
  if (row == 0) o.zero(dt);
  const Tensor b = weight(ad, lora_b_index(site)).slice(size_t(row) * size_t(R), size_t(OC) * size_t(R));
  const Tensor db = grad(ad, ag, lora_b_index(site)).slice(size_t(row) * size_t(R), size_t(OC) * size_t(R));
  timed(
      "lora_B", ph, 2 * linear_flops(N, R, OC), [&] { o.linear_backward(dt, db, dout, t, b, N, R, OC); }, N,
      R, OC);
  if (row + OC < lora_site_out(cfg_, site)) return;
  const Tensor xin = lora_input(x, site, N, IC);  // the forward's dropped-out x again (its mask's key)
  const Tensor A = weight(ad, lora_a_index(site)), dA = grad(ad, ag, lora_a_index(site));
  timed(
      "lora_A", ph, 2 * linear_flops(N, IC, R),
      [&] {
        o.scale(dt, cfg_.lora.scale());
        if (!dropping_) {
          o.linear_backward(dx, dA, dt, xin, A, N, IC, R);
          return;
        }
        // With dropout A's input was mask ⊙ x / (1 - p): dA takes that, and x's gradient is the same mask
        // applied to dt A. dt A goes into lora_x_ once dA's product has read it (stream order), through
        // the forward's dropout (same key, same elements), then into dx.
        o.linear_backward(Tensor{}, dA, dt, xin, A, N, IC, R);
        o.zero(xin);
        o.linear_backward(xin, Tensor{}, dt, x, A, N, IC, R);
        o.dropout(xin, xin, cfg_.lora.dropout, lora_mask_key(site));
        const Tensor d = dx.slice(0, size_t(N) * size_t(IC));
        o.residual_forward(d, d, xin);
      },
      N, IC, R);
}

}  // namespace strata::model
