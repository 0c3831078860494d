// The compute interface's factory — the one place that chooses an implementation by backend — and the
// reads that bring results back to the host.
#include "kernels/ops.h"

#include <cstring>

#include "core/error.h"

namespace strata::kernels {

std::unique_ptr<Ops> make_ops(Device& dev, Stream& stream, OpsOptions opts) {
  switch (dev.caps().backend) {
    case BackendKind::host:
      return make_cpu_ops(dev, stream, opts);
    case BackendKind::cuda:
#ifdef STRATA_WITH_CUDA
      return make_cuda_ops(dev, stream, opts);
#else
      break;
#endif
  }
  throw BackendError(detail::cat("the ", to_string(dev.caps().backend),
                                 " backend's compute ops are not built into this binary; rebuild with the "
                                 "CUDA toolkit (scripts/build.sh finds nvcc) or use --backend host"));
}

std::size_t Ops::scratch_bytes(const OpShapes&) const {
  return 0;
}

void Ops::reserve_scratch(std::size_t) {}

std::string Ops::attention_path(int, int, int, int, int, int, bool) const {
  return caps().name;
}

void Ops::check_model_role(const char* op) const {
  STRATA_CHECK(role_ == OpsRole::model, "kernels: ", op, " called on a runtime-role Ops (", caps().name,
               "), which has the runtime helpers only");
}

void Ops::read(void* host, const void* device, std::size_t bytes) {
  stream_.copy_async(host, device, bytes, CopyKind::device_to_host);
  stream_.synchronize();
}

float Ops::read_f32(Tensor x) {
  STRATA_CHECK(x.dtype == DType::fp32 && x.numel >= 1 && x.data, "kernels: read_f32 of a ",
               dtype_name(x.dtype), " tensor of ", x.numel);
  float v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

double Ops::read_f64(Tensor x) {
  STRATA_CHECK(x.dtype == DType::u8 && x.numel >= sizeof(double) && x.data,
               "kernels: read_f64 needs the 8-byte u8 tensor squared_norm writes");
  double v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

std::int32_t Ops::read_i32(Tensor x) {
  STRATA_CHECK(x.dtype == DType::i32 && x.numel >= 1 && x.data, "kernels: read_i32 of a ",
               dtype_name(x.dtype), " tensor of ", x.numel);
  std::int32_t v = 0;
  read(&v, x.data, sizeof v);
  return v;
}

}  // namespace strata::kernels

// ------------------------------------------------------------------------------ operand checks, then the op

namespace strata::kernels {
namespace {

// `t` holds at least `n` elements of `dtype` (a programming error otherwise: STRATA_CHECK).
void need(const Tensor& t, DType dtype, std::size_t n, const char* what) {
  STRATA_CHECK(t.dtype == dtype, "kernels: ", what, " is ", dtype_name(t.dtype), ", expected ",
               dtype_name(dtype));
  STRATA_CHECK(t.numel >= n, "kernels: ", what, " holds ", t.numel, " elements, the shape needs ", n);
  STRATA_CHECK(n == 0 || t.data != nullptr, "kernels: ", what, " is null");
}

std::size_t sz(long a, long b = 1, long c = 1, long d = 1) {
  return std::size_t(a) * std::size_t(b) * std::size_t(c) * std::size_t(d);
}

constexpr DType F = DType::fp32, I = DType::i32;

}  // namespace

void Ops::embedding_forward(Tensor out, Tensor tokens, Tensor wte, int N, int C, int V) {
  check_model_role("embedding_forward");
  const DType A = caps().activation;
  need(out, A, sz(N, C), "embedding out");
  need(tokens, I, sz(N), "tokens");
  need(wte, A, sz(V, C), "wte");
  do_embedding_forward(out, tokens, wte, N, C, V);
}

void Ops::embedding_backward(Tensor dwte, Tensor dout, Tensor tokens, int N, int C, int V) {
  check_model_role("embedding_backward");
  need(dwte, F, sz(V, C), "dwte");
  need(dout, caps().activation, sz(N, C), "embedding dout");
  need(tokens, I, sz(N), "tokens");
  do_embedding_backward(dwte, dout, tokens, N, C, V);
}

void Ops::rmsnorm_forward(Tensor out, Tensor rstd, Tensor x, Tensor w, int N, int C, float eps,
                          float w_offset) {
  check_model_role("rmsnorm_forward");
  const DType A = caps().activation;
  need(out, A, sz(N, C), "rmsnorm out");
  need(rstd, F, sz(N), "rstd");
  need(x, A, sz(N, C), "rmsnorm x");
  need(w, A, sz(C), "rmsnorm w");
  do_rmsnorm_forward(out, rstd, x, w, N, C, eps, w_offset);
}

void Ops::rmsnorm_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, Tensor rstd, int N, int C,
                           float w_offset) {
  check_model_role("rmsnorm_backward");
  const DType A = caps().activation;
  need(dx, A, sz(N, C), "rmsnorm dx");
  if (dw) need(dw, F, sz(C), "rmsnorm dw");
  need(dout, A, sz(N, C), "rmsnorm dout");
  need(x, A, sz(N, C), "rmsnorm x");
  need(w, A, sz(C), "rmsnorm w");
  need(rstd, F, sz(N), "rstd");
  do_rmsnorm_backward(dx, dw, dout, x, w, rstd, N, C, w_offset);
}

void Ops::linear_forward(Tensor out, Tensor x, Tensor w, int N, int IC, int OC) {
  check_model_role("linear_forward");
  const DType A = caps().activation;
  need(out, A, sz(N, OC), "linear out");
  need(x, A, sz(N, IC), "linear x");
  need(w, A, sz(OC, IC), "linear w");
  do_linear_forward(out, x, w, N, IC, OC);
}

void Ops::linear_backward(Tensor dx, Tensor dw, Tensor dout, Tensor x, Tensor w, int N, int IC, int OC) {
  check_model_role("linear_backward");
  const DType A = caps().activation;
  if (dx) need(dx, A, sz(N, IC), "linear dx");
  if (dw) need(dw, F, sz(OC, IC), "linear dw");
  need(dout, A, sz(N, OC), "linear dout");
  need(x, A, sz(N, IC), "linear x");
  need(w, A, sz(OC, IC), "linear w");
  do_linear_backward(dx, dw, dout, x, w, N, IC, OC);
}
void Ops::bias_forward(Tensor out, Tensor b, int N, int OC) {
  check_model_role("bias_forward");
  const DType A = caps().activation;
  need(out, A, sz(N, OC), "bias out");
  need(b, A, sz(OC), "bias b");
  do_bias_forward(out, b, N, OC);
}
void Ops::bias_backward(Tensor db, Tensor dout, int N, int OC) {
  check_model_role("bias_backward");
  need(db, F, sz(OC), "bias db");
  need(dout, caps().activation, sz(N, OC), "bias dout");
  do_bias_backward(db, dout, N, OC);
}

AttentionSizes Ops::attention_sizes(int B, int T, int NH, int, int, int, bool) const {
  return {.saved = sz(B, NH, T, T), .scratch = sz(B, NH, T, T)};
}

void Ops::rope_cache(Tensor cos, Tensor sin, int T, int HD, std::span<const float> inv_freq) {
  check_model_role("rope_cache");
  need(cos, F, sz(T, HD / 2), "rope cos");
  need(sin, F, sz(T, HD / 2), "rope sin");
  STRATA_CHECK(HD % 2 == 0 && inv_freq.size() == std::size_t(HD / 2), "rope_cache: ", inv_freq.size(),
               " inverse frequencies for head width ", HD);
  do_rope_cache(cos, sin, T, HD, std::vector<float>(inv_freq.begin(), inv_freq.end()));
}

void Ops::rope_cache(Tensor cos, Tensor sin, int T, int HD, float theta) {
  STRATA_CHECK(HD % 2 == 0, "rope_cache: head width ", HD, " must be even");
  std::vector<float> inv_freq(std::size_t(HD / 2));
  cpu::rope_inv_freq(inv_freq.data(), HD, theta);
  rope_cache(cos, sin, T, HD, inv_freq);
}

void Ops::rope_forward(Tensor out, Tensor x, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                       Tensor positions) {
  check_model_role("rope_forward");
  rope_operands(out, x, cos, sin, B, T, H, HD, positions);
  do_rope_forward(out, x, cos, sin, B, T, H, HD, positions);
}

void Ops::rope_backward(Tensor dx, Tensor dout, Tensor cos, Tensor sin, int B, int T, int H, int HD,
                        Tensor positions) {
  check_model_role("rope_backward");
  rope_operands(dx, dout, cos, sin, B, T, H, HD, positions);
  do_rope_backward(dx, dout, cos, sin, B, T, H, HD, positions);
}

void Ops::rope_operands(const Tensor& out, const Tensor& x, const Tensor& cos, const Tensor& sin, int B,
                        int T, int H, int HD, const Tensor& positions) const {
  const DType A = caps().activation;
  need(out, A, sz(B, T, H, HD), "rope out");
  need(x, A, sz(B, T, H, HD), "rope x");
  need(cos, F, sz(T, HD / 2), "rope cos");
  need(sin, F, sz(T, HD / 2), "rope sin");
  if (positions) need(positions, DType::i32, sz(B, T), "rope positions");
}

void Ops::attention_operands(const Tensor& q_shaped, const Tensor& k, const Tensor& v, const Tensor& saved,
                             int B, int T, int NH, int NKV, int HD, int window,
                             const Tensor& positions) const {
  const DType A = caps().activation;
  STRATA_CHECK(window >= 0, "kernels: attention's sliding window is ", window,
               "; it must be 0 (none) or more");
  need(q_shaped, A, sz(B, T, NH, HD), "attention (B,T,NH,HD) operand");
  need(k, A, sz(B, T, NKV, HD), "attention (B,T,NKV,HD) operand");
  need(v, A, sz(B, T, NKV, HD), "attention (B,T,NKV,HD) operand");
  need(saved, F, attention_sizes(B, T, NH, NKV, HD, window, bool(positions)).saved, "attention saved state");
  if (positions) need(positions, DType::i32, sz(B, T), "attention positions");
}

void Ops::attention_forward(Tensor out, Tensor saved, Tensor q, Tensor k, Tensor v, int B, int T, int NH,
                            int NKV, int HD, int window, Tensor positions) {
  check_model_role("attention_forward");
  need(out, caps().activation, sz(B, T, NH, HD), "attention out");
  attention_operands(q, k, v, saved, B, T, NH, NKV, HD, window, positions);
  do_attention_forward(out, saved, q, k, v, B, T, NH, NKV, HD, window, positions);
}

void Ops::attention_backward(Tensor dq, Tensor dk, Tensor dv, Tensor scratch, Tensor dout, Tensor q, Tensor k,
                             Tensor v, Tensor out, Tensor saved, int B, int T, int NH, int NKV, int HD,
                             int window, Tensor positions) {
  check_model_role("attention_backward");
  attention_operands(q, k, v, saved, B, T, NH, NKV, HD, window, positions);
  attention_operands(dout, dk, dv, saved, B, T, NH, NKV, HD, window, positions);
  need(out, caps().activation, sz(B, T, NH, HD), "attention out");
  need(dq, caps().activation, sz(B, T, NH, HD), "attention dq");
  need(scratch, F, attention_sizes(B, T, NH, NKV, HD, window, bool(positions)).scratch, "attention scratch");
  do_attention_backward(dq, dk, dv, scratch, dout, q, k, v, out, saved, B, T, NH, NKV, HD, window, positions);
}

void Ops::swiglu_forward(Tensor out, Tensor gate, Tensor up) {
  check_model_role("swiglu_forward");
  for (const Tensor* t : {&out, &gate, &up}) need(*t, caps().activation, out.numel, "swiglu operand");
  do_swiglu_forward(out, gate, up);
}

void Ops::swiglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  check_model_role("swiglu_backward");
  for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up})
    need(*t, caps().activation, dout.numel, "swiglu operand");
  do_swiglu_backward(dgate, dup, dout, gate, up);
}
void Ops::geglu_forward(Tensor out, Tensor gate, Tensor up) {
  check_model_role("geglu_forward");
  for (const Tensor* t : {&out, &gate, &up}) need(*t, caps().activation, out.numel, "geglu operand");
  do_geglu_forward(out, gate, up);
}
void Ops::geglu_backward(Tensor dgate, Tensor dup, Tensor dout, Tensor gate, Tensor up) {
  check_model_role("geglu_backward");
  for (const Tensor* t : {&dgate, &dup, &dout, &gate, &up})
    need(*t, caps().activation, dout.numel, "geglu operand");
  do_geglu_backward(dgate, dup, dout, gate, up);
}

void Ops::residual_forward(Tensor out, Tensor a, Tensor b) {
  check_model_role("residual_forward");
  for (const Tensor* t : {&out, &a, &b}) need(*t, caps().activation, out.numel, "residual operand");
  do_residual_forward(out, a, b);
}

void Ops::residual_backward(Tensor da, Tensor db, Tensor dout) {
  check_model_role("residual_backward");
  const DType A = caps().activation;
  need(dout, A, dout.numel, "residual dout");
  if (da) need(da, A, dout.numel, "residual da");
  if (db) need(db, A, dout.numel, "residual db");
  do_residual_backward(da, db, dout);
}

void Ops::dropout(Tensor out, Tensor in, double p, std::uint64_t key) {
  check_model_role("dropout");
  STRATA_CHECK(p >= 0 && p < 1, "kernels: dropout probability ", p, " is outside [0, 1)");
  need(in, caps().activation, in.numel, "dropout in");
  need(out, caps().activation, in.numel, "dropout out");
  do_dropout(out, in, p, key);
}

void Ops::cross_entropy(Tensor dlogits, Tensor losses, Tensor mean_loss, Tensor logits, Tensor targets, int N,
                        int V, float grad_scale, int n_valid) {
  check_model_role("cross_entropy");
  const DType A = caps().activation;
  need(logits, A, sz(N, V), "logits");
  if (dlogits) need(dlogits, A, sz(N, V), "dlogits");
  need(losses, F, sz(N), "losses");
  need(mean_loss, F, 1, "mean loss");
  need(targets, I, sz(N), "targets");
  do_cross_entropy(dlogits, losses, mean_loss, logits, targets, N, V, grad_scale, n_valid);
}

void Ops::cast(Tensor out, Tensor in) {
  STRATA_CHECK(out.numel == in.numel, "kernels: cast of ", in.numel, " elements into ", out.numel);
  const bool known = out.dtype == in.dtype || (dtype_is_float(in.dtype) && dtype_is_float(out.dtype));
  STRATA_CHECK(known, "kernels: no cast from ", dtype_name(in.dtype), " to ", dtype_name(out.dtype));
  STRATA_CHECK(in.numel == 0 || (in.data && out.data), "kernels: cast of a null tensor");
  do_cast(out, in);
}

void Ops::dequantize_nf4(Tensor out, const Nf4Blocks& q) {
  STRATA_CHECK(out.dtype == F || out.dtype == DType::bf16, "kernels: dequantize_nf4 into ",
               dtype_name(out.dtype), "; the output is fp32 or bf16");
  STRATA_CHECK(q.blocksize > 0, "kernels: dequantize_nf4 with blocksize 0");
  if (out.numel == 0) return;
  STRATA_CHECK(out.data && q.codes && q.absmax && (!q.double_quant || q.absmax2),
               "kernels: dequantize_nf4 of a null tensor");
  do_dequantize_nf4(out, q);
}

void Ops::fill(Tensor x, float value) {
  need(x, F, x.numel, "fill target");
  do_fill(x, value);
}

void Ops::zero(Tensor x) {
  STRATA_CHECK(x.numel == 0 || x.data, "kernels: zero of a null tensor");
  do_zero(x);
}

void Ops::add(Tensor dst, Tensor src) {
  need(dst, F, src.numel, "add dst");
  need(src, F, src.numel, "add src");
  do_add(dst, src);
}

void Ops::scale(Tensor x, float s) {
  need(x, x.dtype == caps().activation ? caps().activation : F, x.numel, "scale target");
  do_scale(x, s);
}

void Ops::squared_norm(Tensor out, Tensor x) {
  need(out, DType::u8, sizeof(double), "squared norm out");
  need(x, F, x.numel, "squared norm x");
  do_squared_norm(out, x);
}

void Ops::nonfinite_check(Tensor out, Tensor x) {
  need(out, I, 1, "non-finite flag");
  need(x, F, x.numel, "non-finite check x");
  do_nonfinite_check(out, x);
}

void Ops::adamw(Tensor p, Tensor g, Tensor m, Tensor v, Tensor p_out, const AdamW& hp, std::int64_t step,
                float grad_scale) {
  for (const Tensor* t : {&p, &g, &m, &v}) need(*t, F, p.numel, "adamw operand");
  if (p_out) {
    STRATA_CHECK(dtype_is_float(p_out.dtype), "kernels: adamw p_out is ", dtype_name(p_out.dtype));
    STRATA_CHECK(p_out.numel >= p.numel, "kernels: adamw p_out holds ", p_out.numel, " of ", p.numel);
  }
  do_adamw(p, g, m, v, p_out, hp, step, grad_scale);
}

}  // namespace strata::kernels
