#include "gpu/models/fused_ops.hpp"

#include <algorithm>
#include <climits>

#include "gpu/device/error.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/decode_gemv.hpp"
#include "gpu/kernels/norm_rope.hpp"
#include "gpu/kernels/swiglu.hpp"
#include "gpu/kernels/target_fused.hpp"
#endif

namespace tandem::gpu {

at::Tensor rms_norm_composite(const at::Tensor& x, const at::Tensor& weight, double eps) {
  auto xf = x.to(at::kFloat);
  auto normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor apply_rope_composite(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  const auto half = x.size(-1) / 2;
  auto x1 = x.narrow(-1, 0, half);
  auto x2 = x.narrow(-1, half, half);
  auto rotated = at::cat({-x2, x1}, -1);
  auto c = cos.unsqueeze(1).to(x.scalar_type());
  auto s = sin.unsqueeze(1).to(x.scalar_type());
  return x * c + rotated * s;
}

at::Tensor swiglu_composite(const at::Tensor& gate, const at::Tensor& up) {
  return at::silu(gate) * up;
}

namespace {

#ifdef TANDEM_HAVE_CUDA

bool kernel_dtype(at::ScalarType t, kernels::norm_dtype& out) {
  switch (t) {
    case at::kBFloat16: out = kernels::norm_dtype::bf16; return true;
    case at::kHalf: out = kernels::norm_dtype::fp16; return true;
    case at::kFloat: out = kernels::norm_dtype::fp32; return true;
    default: return false;
  }
}

kernels::norm_dtype kernel_dtype(at::ScalarType t) {
  kernels::norm_dtype d{};
  kernel_dtype(t, d);
  return d;
}

bool aligned16(const at::Tensor& t) {
  return reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0;
}

/// `t` contiguous with 16-byte aligned data (a copy only when it is not).
at::Tensor dense_aligned(const at::Tensor& t) {
  auto c = t.contiguous();
  return c.numel() == 0 || aligned16(c) ? c : c.clone(at::MemoryFormat::Contiguous);
}

void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw error(errc::device_failure, std::string(what) + ": " + cudaGetErrorString(e));
}

#endif

/// Empty when the RMSNorm kernels take these operands; otherwise why not.
std::string norm_unsupported(const at::Tensor& x, const at::Tensor& weight) {
#ifndef TANDEM_HAVE_CUDA
  (void)x; (void)weight;
  return "built without CUDA";
#else
  if (!x.is_cuda())
    return "not on CUDA";
  kernels::norm_dtype dt{};
  if (!kernel_dtype(x.scalar_type(), dt))
    return std::string("dtype ") + c10::toString(x.scalar_type());
  if (x.dim() < 1 || weight.dim() != 1 || weight.size(0) != x.size(-1))
    return "weight is not [D]";
  if (weight.scalar_type() != x.scalar_type() || weight.device() != x.device())
    return "weight's dtype or device differs from x's";
  if (x.size(-1) > INT_MAX)
    return "D too large";
  if (const char* why = kernels::rms_norm_unsupported(static_cast<int>(x.size(-1)), dt))
    return why;
  return {};
#endif
}

/// Empty when the RoPE kernel takes these operands; otherwise why not.
std::string rope_unsupported(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#ifndef TANDEM_HAVE_CUDA
  (void)x; (void)cos; (void)sin;
  return "built without CUDA";
#else
  if (!x.is_cuda())
    return "not on CUDA";
  kernels::norm_dtype dt{};
  if (!kernel_dtype(x.scalar_type(), dt))
    return std::string("dtype ") + c10::toString(x.scalar_type());
  if (x.dim() != 4 || cos.dim() != 3 || cos.sizes() != sin.sizes())
    return "x must be [B, heads, T, d] and cos/sin [B, T, d]";
  if ((cos.size(0) != 1 && cos.size(0) != x.size(0)) || cos.size(1) != x.size(2)
      || cos.size(2) != x.size(3))
    return "cos/sin do not match x";
  if (cos.scalar_type() != at::kFloat || sin.scalar_type() != at::kFloat
      || cos.device() != x.device() || sin.device() != x.device())
    return "cos/sin must be float32 on x's device";
  if (cos.requires_grad() || sin.requires_grad())
    return "cos/sin require grad";
  if (x.size(0) > INT_MAX || x.size(1) > INT_MAX || x.size(2) > INT_MAX || x.size(3) > INT_MAX)
    return "sizes beyond int32";
  if (const char* why = kernels::rope_unsupported(static_cast<int>(x.size(3)), dt))
    return why;
  return {};
#endif
}

/// Empty when the SwiGLU kernels take these operands; otherwise why not.
std::string swiglu_unsupported(const at::Tensor& gate, const at::Tensor& up) {
#ifndef TANDEM_HAVE_CUDA
  (void)gate; (void)up;
  return "built without CUDA";
#else
  if (!gate.is_cuda())
    return "not on CUDA";
  if (gate.scalar_type() != at::kBFloat16 && gate.scalar_type() != at::kHalf)
    return std::string("dtype ") + c10::toString(gate.scalar_type());
  if (up.scalar_type() != gate.scalar_type() || up.device() != gate.device())
    return "up's dtype or device differs from gate's";
  if (up.sizes() != gate.sizes())
    return "gate and up differ in shape";
  return {};
#endif
}

#ifdef TANDEM_HAVE_CUDA

// ---- RMSNorm ---------------------------------------------------------------

/// RoPE fused into the norm kernels: per-token tables [tokens, h] (fp32,
/// contiguous) and the rows a token (heads).
struct norm_rope_tables {
  at::Tensor cos, sin;
  int64_t heads = 1;
};

/// y (and rstd, when `save`) for kernel-ready x and weight; with `rope`,
/// y = RoPE(norm(x)).
std::pair<at::Tensor, at::Tensor> norm_forward(const at::Tensor& x, const at::Tensor& weight,
                                               double eps, bool save, const norm_rope_tables* rope = nullptr) {
  c10::cuda::CUDAGuard guard(x.device());
  const auto d = x.size(-1);
  const auto rows = d == 0 ? 0 : x.numel() / d;
  auto y = at::empty(x.sizes(), x.options());
  at::Tensor rstd;
  if (save)
    rstd = at::empty({rows}, x.options().dtype(at::kFloat));
  kernels::rms_norm_fwd_args a;
  a.rows = rows;
  a.dim = static_cast<int>(d);
  a.eps = static_cast<float>(eps);
  a.dtype = kernel_dtype(x.scalar_type());
  a.x = x.data_ptr();
  a.weight = weight.data_ptr();
  a.y = y.data_ptr();
  a.rstd = save ? rstd.data_ptr<float>() : nullptr;
  if (rope != nullptr) {
    a.rope_cos = rope->cos.data_ptr<float>();
    a.rope_sin = rope->sin.data_ptr<float>();
    a.rope_heads = rope->heads;
  }
  check_launch(kernels::rms_norm_forward(a, at::cuda::getCurrentCUDAStream()),
               rope != nullptr ? "rms_norm + RoPE forward" : "rms_norm forward");
  return {y, rstd};
}

/// Forward saves kernel-ready x, weight and rstd; backward runs one kernel
/// for dx (and the dweight partials), one more for dweight when it is needed.
class rms_norm_fn : public torch::autograd::Function<rms_norm_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& weight,
                                                double eps) {
    auto xr = dense_aligned(x), wr = dense_aligned(weight);
    auto [y, rstd] = norm_forward(xr, wr, eps, /*save=*/true);
    ctx->save_for_backward({xr, wr, rstd});
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return norm_backward(ctx, grads[0], at::Tensor());
  }

  /// dx (plus `dx_add`, when defined, in the same kernel) and dweight; with
  /// `rope`, g is RoPE's output gradient (rms_norm_rope_fn).
  static torch::autograd::variable_list norm_backward(torch::autograd::AutogradContext* ctx, const at::Tensor& g,
                                                      const at::Tensor& dx_add,
                                                      const norm_rope_tables* rope = nullptr) {
    const auto s = ctx->get_saved_variables();
    const auto& x = s[0];
    const auto& w = s[1];
    const auto& rstd = s[2];
    const bool want_dx = ctx->needs_input_grad(0), want_dw = ctx->needs_input_grad(1);
    if (!g.defined())
      return {want_dx ? dx_add : at::Tensor(), at::Tensor(), at::Tensor()};
    if (!want_dx && !want_dw)
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    c10::cuda::CUDAGuard guard(x.device());
    auto dy = dense_aligned(g.to(x.scalar_type()));
    const auto d = x.size(-1);
    const auto rows = d == 0 ? 0 : x.numel() / d;
    kernels::rms_norm_bwd_args a;
    a.rows = rows;
    a.dim = static_cast<int>(d);
    a.dtype = kernel_dtype(x.scalar_type());
    a.x = x.data_ptr();
    a.weight = w.data_ptr();
    a.rstd = rstd.data_ptr<float>();
    a.dy = dy.data_ptr();
    if (rope != nullptr) {
      a.rope_cos = rope->cos.data_ptr<float>();
      a.rope_sin = rope->sin.data_ptr<float>();
      a.rope_heads = rope->heads;
    }
    at::Tensor dx, dw, partials;
    at::Tensor add;
    if (want_dx) {
      dx = at::empty(x.sizes(), x.options());
      a.dx = dx.data_ptr();
      if (dx_add.defined()) {
        add = dense_aligned(dx_add.to(x.scalar_type()).reshape(x.sizes()));
        a.dx_add = add.data_ptr();
      }
    }
    if (want_dw) {
      dw = at::empty({d}, w.options());
      partials = at::empty({kernels::rms_norm_bwd_partial_rows(rows, a.dim, a.dtype), d},
                           x.options().dtype(at::kFloat));
      a.dweight = dw.data_ptr();
      a.partials = partials.data_ptr<float>();
    }
    check_launch(kernels::rms_norm_backward(a, at::cuda::getCurrentCUDAStream()),
                 rope != nullptr ? "rms_norm + RoPE backward" : "rms_norm backward");
    return {dx, dw, at::Tensor()};
  }
};

/// {rms_norm(x), x}: the second output passes x on to a later use (a
/// residual add), and the backward adds that use's gradient to the norm's dx
/// inside the norm's kernel, where autograd would sum the two with an add.
class rms_norm_passing_fn : public torch::autograd::Function<rms_norm_passing_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& weight,
                                                double eps) {
    auto y = rms_norm_fn::forward(ctx, x, weight, eps)[0];
    return {y, x};  // an input returned as is: autograd makes it a view with this node as its grad_fn
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    return rms_norm_fn::norm_backward(ctx, grads[0], grads[1]);
  }
};

/// RoPE(rms_norm(x)) over x [B, T, heads, h] (kernel-ready) with per-token
/// tables [B·T, h]: one kernel each way (the norm kernels' rope_cos/rope_sin),
/// the numbers of fused_rms_norm followed by fused_apply_rope.  Returns
/// [B, T, heads, h]; the caller transposes.
class rms_norm_rope_fn : public torch::autograd::Function<rms_norm_rope_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x,
                                                const at::Tensor& weight, const at::Tensor& cos,
                                                const at::Tensor& sin, double eps) {
    auto xr = dense_aligned(x), wr = dense_aligned(weight);
    const norm_rope_tables rope{cos, sin, x.size(2)};
    auto [y, rstd] = norm_forward(xr, wr, eps, /*save=*/true, &rope);
    ctx->save_for_backward({xr, wr, rstd, cos, sin});
    return {y};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const norm_rope_tables rope{s[3], s[4], s[0].size(2)};
    auto out = rms_norm_fn::norm_backward(ctx, grads[0], at::Tensor(), &rope);
    out.resize(5);  // x, weight; nothing for cos, sin, eps
    return out;
  }
};

// ---- RoPE ------------------------------------------------------------------

/// A size-1 dimension's stride is never used: 0 (views leave any value there).
int64_t used_stride(const at::Tensor& t, int dim) {
  return t.size(dim) == 1 ? 0 : t.stride(dim);
}

bool rope_layout_ok(const at::Tensor& t) {
  const int64_t vec = t.scalar_type() == at::kFloat ? 4 : 8;
  return t.numel() == 0
         || (t.stride(3) == 1 && aligned16(t) && used_stride(t, 0) % vec == 0
             && used_stride(t, 1) % vec == 0 && used_stride(t, 2) % vec == 0);
}

/// `t`, or a contiguous aligned copy when the kernel cannot read its layout.
at::Tensor rope_ready(const at::Tensor& t) {
  return rope_layout_ok(t) ? t : dense_aligned(t);
}

/// An output shaped and laid out like `like` where the kernel can write that
/// layout ([B, T, H, d] memory stays so), else contiguous.
at::Tensor rope_output(const at::Tensor& like) {
  auto out = at::empty_like(like);
  return rope_layout_ok(out) ? out : at::empty(like.sizes(), like.options());
}

/// Rotates `in` (ready) by θ, or by −θ when `backward`, into a new tensor.
at::Tensor rope_run(const at::Tensor& in, const at::Tensor& cos, const at::Tensor& sin,
                    bool backward) {
  c10::cuda::CUDAGuard guard(in.device());
  auto out = rope_output(in);
  kernels::rope_args a;
  a.batch = static_cast<int>(in.size(0));
  a.heads = static_cast<int>(in.size(1));
  a.tokens = static_cast<int>(in.size(2));
  a.head_dim = static_cast<int>(in.size(3));
  a.dtype = kernel_dtype(in.scalar_type());
  a.in = {in.data_ptr(), used_stride(in, 0), used_stride(in, 1), used_stride(in, 2)};
  a.out = {out.data_ptr(), used_stride(out, 0), used_stride(out, 1), used_stride(out, 2)};
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  a.table_batch = used_stride(cos, 0);
  a.table_token = used_stride(cos, 1);
  a.backward = backward;
  check_launch(kernels::rope_apply(a, at::cuda::getCurrentCUDAStream()), "apply_rope");
  return out;
}

class rope_fn : public torch::autograd::Function<rope_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& x, const at::Tensor& cos,
                                                const at::Tensor& sin) {
    auto c = dense_aligned(cos), s = dense_aligned(sin);
    ctx->save_for_backward({c, s});
    return {rope_run(rope_ready(x), c, s, /*backward=*/false)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    if (!grads[0].defined())
      return {at::Tensor(), at::Tensor(), at::Tensor()};
    return {rope_run(rope_ready(grads[0]), saved[0], saved[1], /*backward=*/true), at::Tensor(),
            at::Tensor()};
  }
};

// ---- SwiGLU ----------------------------------------------------------------

kernels::swiglu_dtype swiglu_kernel_dtype(at::ScalarType t) {
  return t == at::kHalf ? kernels::swiglu_dtype::fp16 : kernels::swiglu_dtype::bf16;
}

/// silu(gate) · up for contiguous gate and up (any alignment).
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  c10::cuda::CUDAGuard guard(gate.device());
  auto out = at::empty(gate.sizes(), gate.options());
  kernels::swiglu_fwd_args a;
  a.n = gate.numel();
  a.dtype = swiglu_kernel_dtype(gate.scalar_type());
  a.gate = gate.data_ptr();
  a.up = up.data_ptr();
  a.out = out.data_ptr();
  check_launch(kernels::swiglu_forward(a, at::cuda::getCurrentCUDAStream()), "swiglu forward");
  return out;
}

/// Saves contiguous gate and up; backward is one kernel for both gradients.
class swiglu_fn : public torch::autograd::Function<swiglu_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& gate, const at::Tensor& up) {
    auto g = gate.contiguous(), u = up.contiguous();
    ctx->save_for_backward({g, u});
    return {swiglu_forward(g, u)};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const auto& g = s[0];
    const auto& u = s[1];
    const bool want_gate = ctx->needs_input_grad(0), want_up = ctx->needs_input_grad(1);
    if (!grads[0].defined() || (!want_gate && !want_up))
      return {at::Tensor(), at::Tensor()};
    c10::cuda::CUDAGuard guard(g.device());
    auto dy = grads[0].to(g.scalar_type()).contiguous();
    at::Tensor d_gate, d_up;
    kernels::swiglu_bwd_args a;
    a.n = g.numel();
    a.dtype = swiglu_kernel_dtype(g.scalar_type());
    a.grad_out = dy.data_ptr();
    a.gate = g.data_ptr();
    a.up = u.data_ptr();
    if (want_gate) {
      d_gate = at::empty(g.sizes(), g.options());
      a.grad_gate = d_gate.data_ptr();
    }
    if (want_up) {
      d_up = at::empty(u.sizes(), u.options());
      a.grad_up = d_up.data_ptr();
    }
    check_launch(kernels::swiglu_backward(a, at::cuda::getCurrentCUDAStream()),
                 "swiglu backward");
    return {d_gate, d_up};
  }
};

#endif

} // namespace

std::string fused_rms_norm_path(const at::Tensor& x, const at::Tensor& weight) {
  const auto why = norm_unsupported(x, weight);
  return why.empty() ? "cuda kernel" : "composite (" + why + ")";
}

std::string fused_apply_rope_path(const at::Tensor& x, const at::Tensor& cos,
                                  const at::Tensor& sin) {
  const auto why = rope_unsupported(x, cos, sin);
  return why.empty() ? "cuda kernel" : "composite (" + why + ")";
}

std::string fused_swiglu_path(const at::Tensor& gate, const at::Tensor& up) {
  const auto why = swiglu_unsupported(gate, up);
  return why.empty() ? "cuda kernel" : "composite (" + why + ")";
}

at::Tensor fused_rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
#ifdef TANDEM_HAVE_CUDA
  if (norm_unsupported(x, weight).empty()) {
    if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad()))
      return rms_norm_fn::apply(x, weight, eps)[0];
    return norm_forward(dense_aligned(x), dense_aligned(weight), eps, /*save=*/false).first;
  }
#endif
  return rms_norm_composite(x, weight, eps);
}

std::pair<at::Tensor, at::Tensor> fused_rms_norm_passing(const at::Tensor& x, const at::Tensor& weight, double eps) {
#ifdef TANDEM_HAVE_CUDA
  if (norm_unsupported(x, weight).empty() && at::GradMode::is_enabled()
      && (x.requires_grad() || weight.requires_grad())) {
    auto out = rms_norm_passing_fn::apply(x, weight, eps);
    return {out[0], out[1]};
  }
#endif
  return {fused_rms_norm(x, weight, eps), x};
}

std::string fused_rms_norm_rope_path(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& cos,
                                     const at::Tensor& sin) {
#ifdef TANDEM_HAVE_CUDA
  if (x.dim() != 4)
    return "composite (x is not [B, T, heads, h])";
  if (auto why = norm_unsupported(x, weight); !why.empty())
    return "composite (" + why + ")";
  if (auto why = rope_unsupported(x.transpose(1, 2), cos, sin); !why.empty())
    return "composite (" + why + ")";
  kernels::norm_dtype dt{};
  kernel_dtype(x.scalar_type(), dt);
  if (const char* why = kernels::rms_norm_rope_unsupported(static_cast<int>(x.size(-1)), dt))
    return std::string("composite (") + why + ")";
  return "cuda kernel";
#else
  (void)x; (void)weight; (void)cos; (void)sin;
  return "composite (built without CUDA)";
#endif
}

at::Tensor fused_rms_norm_rope(const at::Tensor& x, const at::Tensor& weight, double eps, const at::Tensor& cos,
                               const at::Tensor& sin) {
#ifdef TANDEM_HAVE_CUDA
  if (at::GradMode::is_enabled() && (x.requires_grad() || weight.requires_grad())
      && fused_rms_norm_rope_path(x, weight, cos, sin) == "cuda kernel") {
    const auto b = x.size(0), t = x.size(1), h = x.size(3);
    auto table = [&](const at::Tensor& c) { return c.expand({b, t, h}).contiguous().view({b * t, h}); };
    return rms_norm_rope_fn::apply(x, weight, table(cos), table(sin), eps)[0].transpose(1, 2);
  }
#endif
  return fused_apply_rope(fused_rms_norm(x, weight, eps).transpose(1, 2), cos, sin);
}

at::Tensor fused_apply_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
#ifdef TANDEM_HAVE_CUDA
  if (rope_unsupported(x, cos, sin).empty()) {
    if (at::GradMode::is_enabled() && x.requires_grad())
      return rope_fn::apply(x, cos, sin)[0];
    return rope_run(rope_ready(x), dense_aligned(cos), dense_aligned(sin), /*backward=*/false);
  }
#endif
  return apply_rope_composite(x, cos, sin);
}

void qk_norm_rope_inplace(const at::Tensor& qkv, const at::Tensor& q_norm, const at::Tensor& k_norm,
                          int64_t heads, int64_t kv_heads, int64_t head_dim, double eps,
                          const at::Tensor& cos, const at::Tensor& sin, const at::Tensor& k_cache,
                          const at::Tensor& v_cache, const at::Tensor& lengths, int64_t tokens_per_row) {
#ifdef TANDEM_HAVE_CUDA
  c10::cuda::CUDAGuard guard(qkv.device());
  kernels::qk_norm_rope_args a;
  a.tokens = qkv.size(0);
  a.heads = static_cast<int>(heads);
  a.kv_heads = static_cast<int>(kv_heads);
  a.head_dim = static_cast<int>(head_dim);
  a.row_stride = qkv.stride(0);
  a.eps = static_cast<float>(eps);
  a.dtype = qkv.scalar_type() == at::kHalf ? kernels::fused_dtype::fp16 : kernels::fused_dtype::bf16;
  a.qkv = qkv.data_ptr();
  a.q_norm = q_norm.data_ptr();
  a.k_norm = k_norm.data_ptr();
  a.cos = cos.data_ptr<float>();
  a.sin = sin.data_ptr<float>();
  if (k_cache.defined()) {
    if (!k_cache.is_contiguous() || !v_cache.is_contiguous() || k_cache.sizes() != v_cache.sizes()
        || k_cache.dim() != 4 || k_cache.size(1) != kv_heads || k_cache.size(3) != head_dim
        || k_cache.scalar_type() != qkv.scalar_type() || lengths.scalar_type() != at::kLong
        || lengths.numel() != k_cache.size(0) || qkv.size(0) != k_cache.size(0) * tokens_per_row)
      throw error(errc::bad_input, "q/k norm + rope: the caches, lengths or tokens per row do not match qkv");
    a.k_cache = k_cache.data_ptr();
    a.v_cache = v_cache.data_ptr();
    a.lengths = lengths.data_ptr<int64_t>();
    a.capacity = k_cache.size(2);
    a.tokens_per_row = tokens_per_row;
  }
  check_launch(kernels::qk_norm_rope(a, at::cuda::getCurrentCUDAStream()), "q/k norm + rope");
#else
  (void)qkv, (void)q_norm, (void)k_norm, (void)heads, (void)kv_heads, (void)head_dim, (void)eps, (void)cos, (void)sin;
  (void)k_cache, (void)v_cache, (void)lengths, (void)tokens_per_row;
  throw error(errc::device_failure, "q/k norm + rope: built without CUDA");
#endif
}

at::Tensor decode_linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& residual,
                         const at::Tensor& norm_weight, double eps, bool swiglu_input) {
#ifdef TANDEM_HAVE_CUDA
  const auto t = x.scalar_type();
  if (!x.is_cuda() || (t != at::kBFloat16 && t != at::kHalf) || x.dim() != 2 || w.dim() != 2
      || w.scalar_type() != t || !w.is_contiguous() || w.device() != x.device() || x.stride(1) != 1
      || w.size(1) * (swiglu_input ? 2 : 1) != x.size(1) || (swiglu_input && norm_weight.defined())
      || (at::GradMode::is_enabled() && (x.requires_grad() || w.requires_grad())))
    return {};
  const auto m = x.size(0), n = w.size(0);
  if (residual.defined()
      && (residual.scalar_type() != t || residual.dim() != 2 || residual.size(0) != m || residual.size(1) != n
          || residual.stride(1) != 1 || residual.device() != x.device()))
    return {};
  if (norm_weight.defined()
      && (norm_weight.scalar_type() != t || norm_weight.numel() != w.size(1) || !norm_weight.is_contiguous()
          || norm_weight.device() != x.device()))
    return {};
  kernels::decode_gemv_args a;
  a.m = static_cast<int>(std::min<int64_t>(m, INT_MAX));
  a.n = n;
  a.k = w.size(1);
  a.swiglu_input = swiglu_input;
  a.dtype = t == at::kHalf ? kernels::gemv_dtype::fp16 : kernels::gemv_dtype::bf16;
  a.x = x.data_ptr();
  a.ldx = x.stride(0);
  a.w = w.data_ptr();
  if (residual.defined()) {
    a.residual = residual.data_ptr();
    a.ldr = residual.stride(0);
  }
  if (norm_weight.defined())
    a.norm_weight = norm_weight.data_ptr();
  a.eps = static_cast<float>(eps);
  a.ldy = n;
  if (kernels::decode_gemv_unsupported(a))
    return {};  // before allocating y: the caller runs cuBLAS, which makes its own
  auto y = at::empty({m, n}, x.options());
  a.y = y.data_ptr();
  c10::cuda::CUDAGuard guard(x.device());
  check_launch(kernels::decode_gemv(a, at::cuda::getCurrentCUDAStream()), "decode gemv");
  return y;
#else
  (void)x, (void)w, (void)residual, (void)norm_weight, (void)eps, (void)swiglu_input;
  return {};
#endif
}

at::Tensor swiglu_rows(const at::Tensor& gu) {
#ifdef TANDEM_HAVE_CUDA
  c10::cuda::CUDAGuard guard(gu.device());
  const auto inter = gu.size(1) / 2;
  auto out = at::empty({gu.size(0), inter}, gu.options());
  kernels::swiglu_rows_args a;
  a.tokens = gu.size(0);
  a.inter = inter;
  a.dtype = gu.scalar_type() == at::kHalf ? kernels::fused_dtype::fp16 : kernels::fused_dtype::bf16;
  a.gu = gu.data_ptr();
  a.out = out.data_ptr();
  check_launch(kernels::swiglu_rows(a, at::cuda::getCurrentCUDAStream()), "swiglu rows");
  return out;
#else
  (void)gu;
  throw error(errc::device_failure, "swiglu rows: built without CUDA");
#endif
}

at::Tensor fused_swiglu(const at::Tensor& gate, const at::Tensor& up) {
#ifdef TANDEM_HAVE_CUDA
  if (swiglu_unsupported(gate, up).empty()) {
    if (at::GradMode::is_enabled() && (gate.requires_grad() || up.requires_grad()))
      return swiglu_fn::apply(gate, up)[0];
    return swiglu_forward(gate.contiguous(), up.contiguous());
  }
#endif
  return swiglu_composite(gate, up);
}

} // namespace tandem::gpu
