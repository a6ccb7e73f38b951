#include "gpu/models/dflash_attention.hpp"

#include <cstdlib>
#include <limits>

#include "gpu/device/error.hpp"
#include "gpu/models/common.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/dflash_attention.hpp"
#endif

namespace tandem::gpu {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok)
    throw error(errc::bad_input, "dflash_attention: " + what);
}

/// Sizes of one call, checked for consistency.
struct attn_dims {
  int64_t batch = 0, heads = 0, kv_heads = 0, q_len = 0, ctx_len = 0, head_dim = 0, blocks = 0,
          block_size = 0;
  int64_t own_keys = 0;  ///< own-block keys seen (0: all; kernels.own_keys)
};

std::string sizes_text(const at::Tensor& t) {
  std::string s = "[";
  for (int64_t i = 0; i < t.dim(); ++i)
    s += (i ? ", " : "") + std::to_string(t.size(i));
  return s + "]";
}

attn_dims check_dims(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                     const at::Tensor& k_blk, const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                     const at::Tensor& ctx_hi, const at::Tensor& keep) {
  require(q.dim() == 4 && k_ctx.dim() == 4 && v_ctx.dim() == 4 && k_blk.dim() == 4
            && v_blk.dim() == 4,
          "q, k and v must be 4-d [B, heads, T, d]");
  attn_dims m;
  m.batch = q.size(0);
  m.heads = q.size(1);
  m.q_len = q.size(2);
  m.head_dim = q.size(3);
  m.kv_heads = k_ctx.size(1);
  m.ctx_len = k_ctx.size(2);
  m.blocks = ctx_lo.dim() == 2 ? ctx_lo.size(1) : -1;
  require(ctx_lo.dim() == 2 && ctx_lo.sizes() == ctx_hi.sizes() && ctx_lo.sizes() == keep.sizes()
            && ctx_lo.size(0) == m.batch,
          "ctx_lo, ctx_hi and keep must be [B, N]; got " + sizes_text(ctx_lo) + ", "
            + sizes_text(ctx_hi) + ", " + sizes_text(keep));
  require(m.blocks > 0 && m.q_len % m.blocks == 0,
          "Q = " + std::to_string(m.q_len) + " is not a multiple of N = " + std::to_string(m.blocks));
  m.block_size = m.q_len / m.blocks;
  require(m.kv_heads > 0 && m.heads % m.kv_heads == 0, "heads " + std::to_string(m.heads)
                                                          + " not a multiple of kv heads "
                                                          + std::to_string(m.kv_heads));
  const std::vector<int64_t> ctx{m.batch, m.kv_heads, m.ctx_len, m.head_dim};
  const std::vector<int64_t> blk{m.batch, m.kv_heads, m.q_len, m.head_dim};
  require(v_ctx.sizes() == at::IntArrayRef(ctx) && k_blk.sizes() == at::IntArrayRef(blk)
            && v_blk.sizes() == at::IntArrayRef(blk),
          "shapes q " + sizes_text(q) + ", k_ctx " + sizes_text(k_ctx) + ", v_ctx "
            + sizes_text(v_ctx) + ", k_blk " + sizes_text(k_blk) + ", v_blk " + sizes_text(v_blk)
            + " do not agree");
  return m;
}

/// The mask over [context | blocks] keys, [B, 1, Q, S + Q].  With
/// `padding_sees_own_block`, rows of keep = false blocks see their own
/// block (SDPA then never meets an all-masked row; the rows are zeroed after).
at::Tensor layout_mask(const at::Tensor& ctx_lo, const at::Tensor& ctx_hi, const at::Tensor& keep,
                       int64_t ctx_len, int64_t block_size, bool padding_sees_own_block) {
  const auto b = ctx_lo.size(0), n = ctx_lo.size(1), q_len = n * block_size;
  auto lopts = ctx_lo.options().dtype(at::kLong);
  auto kept = keep.to(at::kBool).unsqueeze(2);                                      // [B, N, 1]
  auto kv = at::arange(ctx_len, lopts).view({1, 1, ctx_len});
  auto ctx = (kv >= ctx_lo.to(at::kLong).unsqueeze(2)) & (kv < ctx_hi.to(at::kLong).unsqueeze(2))
             & kept;                                                                // [B, N, S]
  ctx = ctx.unsqueeze(2).expand({b, n, block_size, ctx_len}).reshape({b, q_len, ctx_len});
  auto block_id = at::arange(q_len, lopts).floor_divide(block_size);
  auto blk = (block_id.unsqueeze(1) == block_id.unsqueeze(0)).unsqueeze(0).expand({b, q_len, q_len});
  if (!padding_sees_own_block)
    blk = blk & kept.expand({b, n, block_size}).reshape({b, q_len, 1});
  return at::cat({ctx, blk}, 2).unsqueeze(1);
}

#ifdef TANDEM_HAVE_CUDA

/// Element strides for the kernels; a size-1 dimension's stride is never
/// used, so it is passed as 0 (views leave arbitrary values there).
std::array<int64_t, 3> kernel_strides(const at::Tensor& t) {
  std::array<int64_t, 3> s{};
  for (int i = 0; i < 3; ++i)
    s[i] = t.size(i) == 1 ? 0 : t.stride(i);
  return s;
}

/// `t`, or a contiguous copy when its layout does not suit the kernels
/// (d contiguous, 16-byte aligned rows).
at::Tensor kernel_ready(const at::Tensor& t) {
  const auto s = kernel_strides(t);
  const bool ok = t.numel() == 0
                  || (t.stride(3) == 1 && s[0] % 8 == 0 && s[1] % 8 == 0 && s[2] % 8 == 0
                      && reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 == 0);
  return ok ? t : t.contiguous();
}

kernels::attn_in in_view(const at::Tensor& t) {
  const auto s = kernel_strides(t);
  return {t.data_ptr(), s[0], s[1], s[2]};
}

kernels::attn_out out_view(const at::Tensor& t) {
  const auto s = kernel_strides(t);
  return {t.data_ptr(), s[0], s[1], s[2]};
}

/// [B, T, heads, d] memory seen as [B, heads, T, d]: the layout whose
/// transpose(1, 2) the drafter's o_proj reads without a copy.
at::Tensor empty_bthd(int64_t b, int64_t heads, int64_t t, int64_t d, const at::TensorOptions& o) {
  return at::empty({b, t, heads, d}, o).transpose(1, 2);
}

kernels::dflash_attention_shape kernel_shape(const attn_dims& m, double scale,
                                             at::ScalarType dtype) {
  kernels::dflash_attention_shape sh;
  sh.batch = static_cast<int>(m.batch);
  sh.heads = static_cast<int>(m.heads);
  sh.kv_heads = static_cast<int>(m.kv_heads);
  sh.ctx_len = static_cast<int>(m.ctx_len);
  sh.blocks = static_cast<int>(m.blocks);
  sh.block_size = static_cast<int>(m.block_size);
  sh.own_keys = static_cast<int>(m.own_keys);
  sh.head_dim = static_cast<int>(m.head_dim);
  sh.scale = static_cast<float>(scale);
  sh.dtype = dtype == at::kHalf ? kernels::attn_dtype::fp16 : kernels::attn_dtype::bf16;
  return sh;
}

/// Ranges as the kernels read them: int32 and bytes, contiguous.
struct kernel_ranges {
  at::Tensor lo, hi, keep;
  kernels::dflash_ranges view() const {
    return {lo.data_ptr<int32_t>(), hi.data_ptr<int32_t>(),
            reinterpret_cast<const uint8_t*>(keep.data_ptr<bool>())};
  }
};

kernel_ranges ranges_for_kernel(const at::Tensor& lo, const at::Tensor& hi, const at::Tensor& keep) {
  return {lo.to(at::kInt).contiguous(), hi.to(at::kInt).contiguous(),
          keep.to(at::kBool).contiguous()};
}

/// The kernels' variant bits (gpu/kernels/dflash_attention.cu; 0, the
/// tuned default): TANDEM_ATTENTION_VARIANT, read once, lets `tandem bench`
/// time a kernel variant inside the whole drafter step (docs/bench.md).
/// Refused: anything but an integer of the known bits, and bits 16 and 32,
/// which skip part of the backward (the harness's timing, never a step's).
int kernel_variant() {
  static const int v = [] {
    const char* env = std::getenv("TANDEM_ATTENTION_VARIANT");
    if (env == nullptr || *env == '\0')
      return 0;
    char* end = nullptr;
    const long x = std::strtol(env, &end, 10);
    const std::string text = env;
    if (*end != '\0' || x < 0 || x >= 8192)
      throw error(errc::bad_input, "TANDEM_ATTENTION_VARIANT='" + text
                                     + "' is not an integer of the kernels' variant bits (0 to 8191)");
    if (x & (16 | 32))
      throw error(errc::bad_input, "TANDEM_ATTENTION_VARIANT='" + text
                                     + "': bits 16 and 32 skip part of the backward (incomplete gradients; "
                                       "tests/gpu/dflash_attention_harness.py times them)");
    return static_cast<int>(x);
  }();
  return v;
}

/// The bits that choose the forward's form (mma.sync everywhere, the former
/// wgmma form, two blocks a CTA): the target's chunked attention takes these
/// of TANDEM_ATTENTION_VARIANT too, so `tandem bench target_forward` can A/B them.
constexpr int forward_variant_bits = 64 | 2048 | 4096;

void check_launch(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw error(errc::device_failure,
                std::string("dflash_attention ") + what + ": " + cudaGetErrorString(e));
}

#endif

/// Empty when the kernels take operands of this device, dtype and sizes;
/// otherwise why not.
std::string kernel_unsupported(const at::TensorOptions& o, int64_t heads, int64_t kv_heads,
                               int64_t head_dim, int64_t block_size) {
#ifndef TANDEM_HAVE_CUDA
  (void)o; (void)heads; (void)kv_heads; (void)head_dim; (void)block_size;
  return "built without CUDA";
#else
  if (!o.device().is_cuda())
    return "not on CUDA";
  const auto dtype = c10::typeMetaToScalarType(o.dtype());
  if (dtype != at::kBFloat16 && dtype != at::kHalf)
    return std::string("dtype ") + c10::toString(dtype);
  if (heads > 65535 || kv_heads <= 0 || head_dim > 65535 || block_size > 65535)
    return "sizes";
  attn_dims m;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.block_size = block_size;
  if (const char* why = kernels::dflash_attention_unsupported(kernel_shape(m, 1.0, dtype)))
    return why;
  return {};
#endif
}

/// The form in which the kernels take a drafter's operands.
///
/// Blocks: the kernels' blocks are 16 rows.  A smaller block size Bs (DFlash
/// also trains 8 and 10) runs as blocks of 16 rows, each block's Bs rows
/// first and zero rows after (`pad_rows`), the kernels told that only the
/// first Bs own keys are seen (`own_keys`): 16 / Bs the rows, where the
/// dense-mask path does ≈ 7× the work.  A zero row's output is dropped and
/// its gradient is zero (dO = 0 there: no dS); the padding keys are unseen.
///
/// GQA group G = heads / kv_heads: the kernels take 1, 2, 4 and 8 as they
/// are, and run Hopper's wgmma only at a multiple of 4 (sm_90, head_dim
/// 128); mma.sync elsewhere, ≈ 3× slower a head (docs/bench.md, thirteenth
/// pass).  Another group becomes one they take in one of two ways:
/// - padded (`pad_to` > 0): each kv head's G query heads are followed by
///   pad_to − G heads of zeros (a group of pad_to, 4⌈G/4⌉), then each kv head
///   is repeated `repeat` = pad_to / 4 times (a group of 4: at one document
///   a row 5% faster than 8 for the same heads, 1–3% slower at four).  Only
///   where wgmma runs (kernels::dflash_attention_uses_wgmma: ≤ 1.6× the
///   work, G = 5: 8), where it measured 1.3–2.8× faster than the
///   repeated form for G = 3, 5, 6, 7, while for G = 1 and 2 the kernels'
///   own mma.sync forms stay faster than 4× and 2× the work.  A zero query
///   head adds nothing to any gradient, as a zero row.
/// - repeated (`pad_to` 0): each kv head repeated `repeat` times, the group
///   then G / repeat, the largest of 8, 4, 2, 1 dividing G (no extra work,
///   mma.sync unless that group is 4 or 8).
/// TANDEM_ATTENTION_VARIANT bit 1024 takes the repeated form where the
/// padded one would run (A/B).
struct kernel_form {
  bool runs = false;  ///< the kernels take the operands in this form
  bool pad_rows = false;
  int64_t pad_to = 0, repeat = 1;
  bool as_is() const { return runs && !pad_rows && pad_to == 0 && repeat == 1; }
};
constexpr int gqa_repeat_variant = 1024;

#ifdef TANDEM_HAVE_CUDA
/// Whether the kernels run these heads through wgmma on o's device (blocks
/// a row: 0 when not known, as for dflash_attention_path).
bool wgmma_runs(const at::TensorOptions& o, int64_t heads, int64_t kv_heads, int64_t head_dim,
                int64_t blocks) {
  if (!o.device().is_cuda())
    return false;
  attn_dims m;
  m.heads = heads;
  m.kv_heads = kv_heads;
  m.head_dim = head_dim;
  m.block_size = 16;
  m.blocks = blocks;
  const auto dtype = c10::typeMetaToScalarType(o.dtype());
  return kernels::dflash_attention_uses_wgmma(kernel_shape(m, 1.0, dtype), kernel_variant(),
                                              at::cuda::getDeviceProperties(o.device().index())->major);
}
#endif

kernel_form kernel_form_for(const at::TensorOptions& o, int64_t heads, int64_t kv_heads,
                            int64_t head_dim, int64_t block_size, int64_t blocks = 0) {
  if (kv_heads <= 0 || heads % kv_heads != 0)
    return {};
  kernel_form f;
  f.pad_rows = block_size >= 1 && block_size < 16;
  const int64_t rows = f.pad_rows ? 16 : block_size;
  auto takes = [&](int64_t h, int64_t kv) {
    return kernel_unsupported(o, h, kv, head_dim, rows).empty();
  };
  f.runs = true;
  if (takes(heads, kv_heads))
    return f;
  const int64_t group = heads / kv_heads;
#ifdef TANDEM_HAVE_CUDA
  const int64_t pad_to = (group + 3) / 4 * 4;
  if (group % 4 != 0 && !(kernel_variant() & gqa_repeat_variant)
      && takes(kv_heads * pad_to, kv_heads * pad_to / 4)
      && wgmma_runs(o, kv_heads * pad_to, kv_heads * pad_to / 4, head_dim, blocks)) {
    f.pad_to = pad_to;
    f.repeat = pad_to / 4;
    return f;
  }
#endif
  for (int64_t taken : {8, 4, 2, 1})
    if (group % taken == 0 && group != taken && takes(heads, heads / taken)) {
      f.repeat = group / taken;
      return f;
    }
  return {};
}

/// [B, Hkv, T, d] → [B, Hkv·r, T, d], each kv head r times in a row (query
/// head h still meets kv head h / G).  A broadcast and a copy: its backward
/// sums the r copies' gradients (a plain reduction: repeatable bit for bit,
/// where repeat_interleave's index_select would add them with atomics).
at::Tensor repeat_kv_heads(const at::Tensor& t, int64_t r) {
  const auto b = t.size(0), h = t.size(1), n = t.size(2), d = t.size(3);
  return t.unsqueeze(2).expand({b, h, r, n, d}).reshape({b, h * r, n, d});
}

/// q [B, Hkv·G, Q, d] → [B, Hkv·P, Q, d] over [B, Q, Hkv·P, d] memory (the
/// layout the kernels' output also has), each kv head's G heads followed
/// by P − G heads of zeros.  Differentiable (its backward drops the zeros).
at::Tensor pad_query_heads(const at::Tensor& q, int64_t kv_heads, int64_t pad_to) {
  const auto b = q.size(0), g = q.size(1) / kv_heads, n = q.size(2), d = q.size(3);
  auto t = q.transpose(1, 2).reshape({b, n, kv_heads, g, d});
  return at::constant_pad_nd(t, {0, 0, 0, pad_to - g}).view({b, n, kv_heads * pad_to, d}).transpose(1, 2);
}

/// The inverse for the output: [B, Hkv·P, Q, d] → [B, Hkv·G, Q, d] over
/// [B, Q, Hkv·G, d] memory (so the caller's transpose + reshape stays a view).
at::Tensor drop_padded_heads(const at::Tensor& out, int64_t kv_heads, int64_t group) {
  const auto b = out.size(0), p = out.size(1) / kv_heads, n = out.size(2), d = out.size(3);
  return out.transpose(1, 2)
    .reshape({b, n, kv_heads, p, d})
    .narrow(3, 0, group)
    .reshape({b, n, kv_heads * group, d})
    .transpose(1, 2);
}

/// [B, h, N·Bs, d] → [B, h, N·16, d] over [B, N·16, h, d] memory, each
/// block's Bs rows followed by 16 − Bs rows of zeros.  Differentiable.
at::Tensor pad_block_rows(const at::Tensor& t, int64_t blocks) {
  const auto b = t.size(0), h = t.size(1), bs = t.size(2) / blocks, d = t.size(3);
  auto u = t.transpose(1, 2).reshape({b, blocks, bs, h, d});
  return at::constant_pad_nd(u, {0, 0, 0, 0, 0, 16 - bs}).view({b, blocks * 16, h, d}).transpose(1, 2);
}

/// The inverse for the output: [B, h, N·16, d] → [B, h, N·Bs, d] over
/// [B, N·Bs, h, d] memory.
at::Tensor drop_block_rows(const at::Tensor& out, int64_t blocks, int64_t block_size) {
  const auto b = out.size(0), h = out.size(1), d = out.size(3);
  return out.transpose(1, 2)
    .reshape({b, blocks, 16, h, d})
    .narrow(2, 0, block_size)
    .reshape({b, blocks * block_size, h, d})
    .transpose(1, 2);
}

/// The same for actual operands (sizes beyond int32, mixed dtypes).
std::string kernel_unsupported(const at::Tensor& q, const at::Tensor& k_ctx,
                               const at::Tensor& k_blk, int64_t blocks) {
  if (q.dim() != 4 || k_ctx.dim() != 4 || blocks <= 0 || q.size(2) % blocks != 0)
    return "shape";
  if (k_ctx.scalar_type() != q.scalar_type() || k_blk.scalar_type() != q.scalar_type())
    return "mixed dtypes";
  if (k_ctx.size(2) > INT32_MAX || q.size(2) > INT32_MAX || q.size(0) > 65535)
    return "sizes beyond the kernels' grid";
  return kernel_unsupported(q.options(), q.size(1), k_ctx.size(1), q.size(3), q.size(2) / blocks);
}

#ifdef TANDEM_HAVE_CUDA

dflash_attention_result kernel_forward(const attn_dims& m, const at::Tensor& q,
                                       const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                                       const at::Tensor& k_blk, const at::Tensor& v_blk,
                                       const kernel_ranges& r, double scale) {
  c10::cuda::CUDAGuard guard(q.device());
  dflash_attention_result res;
  res.out = empty_bthd(m.batch, m.heads, m.q_len, m.head_dim, q.options());
  res.lse = at::empty({m.batch, m.heads, m.q_len}, q.options().dtype(at::kFloat));
  kernels::dflash_attention_fwd_args a;
  a.shape = kernel_shape(m, scale, q.scalar_type());
  a.variant = kernel_variant();
  a.q = in_view(q);
  a.k_ctx = in_view(k_ctx);
  a.v_ctx = in_view(v_ctx);
  a.k_blk = in_view(k_blk);
  a.v_blk = in_view(v_blk);
  a.ranges = r.view();
  a.out = out_view(res.out);
  a.lse = res.lse.data_ptr<float>();
  check_launch(kernels::dflash_attention_forward(a, at::cuda::getCurrentCUDAStream()), "forward");
  return res;
}

dflash_attention_grads kernel_backward(const attn_dims& m, const at::Tensor& q,
                                       const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                                       const at::Tensor& k_blk, const at::Tensor& v_blk,
                                       const kernel_ranges& r, double scale, const at::Tensor& out,
                                       const at::Tensor& lse, const at::Tensor& dout) {
  c10::cuda::CUDAGuard guard(q.device());
  const auto o = q.options();
  dflash_attention_grads g;
  g.dq = empty_bthd(m.batch, m.heads, m.q_len, m.head_dim, o);
  g.dk_ctx = empty_bthd(m.batch, m.kv_heads, m.ctx_len, m.head_dim, o);
  g.dv_ctx = empty_bthd(m.batch, m.kv_heads, m.ctx_len, m.head_dim, o);
  g.dk_blk = empty_bthd(m.batch, m.kv_heads, m.q_len, m.head_dim, o);
  g.dv_blk = empty_bthd(m.batch, m.kv_heads, m.q_len, m.head_dim, o);
  auto delta = at::empty({m.batch, m.heads, m.q_len}, o.dtype(at::kFloat));
  const auto lse_c = lse.contiguous();
  kernels::dflash_attention_bwd_args a;
  a.shape = kernel_shape(m, scale, q.scalar_type());
  a.variant = kernel_variant();
  a.q = in_view(q);
  a.k_ctx = in_view(k_ctx);
  a.v_ctx = in_view(v_ctx);
  a.k_blk = in_view(k_blk);
  a.v_blk = in_view(v_blk);
  a.out = in_view(out);
  a.dout = in_view(dout);
  a.lse = lse_c.data_ptr<float>();
  a.ranges = r.view();
  a.delta = delta.data_ptr<float>();
  a.dq = out_view(g.dq);
  a.dk_ctx = out_view(g.dk_ctx);
  a.dv_ctx = out_view(g.dv_ctx);
  a.dk_blk = out_view(g.dk_blk);
  a.dv_blk = out_view(g.dv_blk);
  check_launch(kernels::dflash_attention_backward(a, at::cuda::getCurrentCUDAStream()), "backward");
  return g;
}

/// Forward saves the kernel-ready operands, out and lse; backward runs the
/// two backward kernels (no autograd graph inside either).
class dflash_attention_fn : public torch::autograd::Function<dflash_attention_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& q, const at::Tensor& k_ctx,
                                                const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                                const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                                                const at::Tensor& ctx_hi, const at::Tensor& keep,
                                                double scale, int64_t own_keys) {
    auto m = check_dims(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep);
    m.own_keys = own_keys;
    auto qr = kernel_ready(q), kcr = kernel_ready(k_ctx), vcr = kernel_ready(v_ctx),
         kbr = kernel_ready(k_blk), vbr = kernel_ready(v_blk);
    auto r = ranges_for_kernel(ctx_lo, ctx_hi, keep);
    auto res = kernel_forward(m, qr, kcr, vcr, kbr, vbr, r, scale);
    ctx->save_for_backward({qr, kcr, vcr, kbr, vbr, r.lo, r.hi, r.keep, res.out, res.lse});
    ctx->saved_data["scale"] = scale;
    ctx->saved_data["own_keys"] = own_keys;
    return {res.out};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->get_saved_variables();
    const double scale = ctx->saved_data["scale"].toDouble();
    const kernel_ranges r{s[5], s[6], s[7]};
    auto m = check_dims(s[0], s[1], s[2], s[3], s[4], r.lo, r.hi, r.keep);
    m.own_keys = ctx->saved_data["own_keys"].toInt();
    auto g = kernel_backward(m, s[0], s[1], s[2], s[3], s[4], r, scale, s[8], s[9],
                             kernel_ready(grads[0]));
    return {g.dq, g.dk_ctx, g.dv_ctx, g.dk_blk, g.dv_blk,
            at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

#endif

} // namespace

at::Tensor dflash_visible_mask(const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
                               const at::Tensor& keep, int64_t ctx_len, int64_t block_size) {
  return layout_mask(ctx_lo, ctx_hi, keep, ctx_len, block_size, /*padding_sees_own_block=*/false);
}

at::Tensor masked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double scale) {
  const int64_t scores = q.numel() / std::max<int64_t>(q.size(-1), 1) * k.size(-2);
  if (q.is_cuda() && scores * 4 <= masked_attention_math_bytes) {
    // The math composite adds its mask to the scores as it is: a boolean
    // one must become 0 / -inf first (the public SDPA converts it before it
    // dispatches; calling the composite directly skips that — a bool mask
    // then added 1 to the visible scores and hid nothing: rel err 0.7 on
    // the H200, dflash_attention.cuda_unsupported_operands_fall_back_to_dense).
    const auto additive = mask.scalar_type() == at::kBool
                            ? at::zeros(mask.sizes(), q.options()).masked_fill(
                                mask.logical_not(), -std::numeric_limits<double>::infinity())
                            : mask;
    return std::get<0>(at::_scaled_dot_product_attention_math(q, k, v, additive, 0.0, false, {}, scale));
  }
  return at::scaled_dot_product_attention(q, k, v, mask, 0.0, false, scale);
}

at::Tensor dflash_attention_dense(const at::Tensor& q, const at::Tensor& k_ctx,
                                  const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                  const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                                  const at::Tensor& ctx_hi, const at::Tensor& keep, double scale) {
  const auto m = check_dims(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep);
  // Padding rows attend to their own block (finite on every SDPA backend),
  // then are zeroed: no NaN, and their gradient is exactly zero.
  auto mask = layout_mask(ctx_lo, ctx_hi, keep, m.ctx_len, m.block_size, true);
  auto k = expand_kv_heads(at::cat({k_ctx, k_blk}, 2), m.heads);
  auto v = expand_kv_heads(at::cat({v_ctx, v_blk}, 2), m.heads);
  auto out = masked_attention(q, k, v, mask, scale);
  auto rows = keep.to(at::kBool).repeat_interleave(m.block_size, 1).view({m.batch, 1, m.q_len, 1});
  return at::where(rows, out, at::zeros({}, out.options()));
}

std::string dflash_attention_path(const at::TensorOptions& options, int64_t heads,
                                  int64_t kv_heads, int64_t head_dim, int64_t block_size) {
  if (kernel_unsupported(options, heads, kv_heads, head_dim, block_size).empty())
    return "cuda kernel";
  const auto form = kernel_form_for(options, heads, kv_heads, head_dim, block_size);
  if (form.runs) {
    std::string how;
    if (form.pad_rows)
      how = "blocks of " + std::to_string(block_size) + " rows padded to 16";
    const auto group = std::to_string(heads / kv_heads);
    if (form.pad_to > 0)
      how += std::string(how.empty() ? "" : "; ") + "query heads padded to a group of "
             + std::to_string(form.pad_to)
             + (form.repeat > 1 ? ", kv heads repeated " + std::to_string(form.repeat) + "x" : std::string())
             + ": GQA group " + group;
    else if (form.repeat > 1)
      how += std::string(how.empty() ? "" : "; ") + "kv heads repeated " + std::to_string(form.repeat)
             + "x: GQA group " + group;
    return "cuda kernel (" + how + ")";
  }
  // Why not, at 16 rows where a smaller block would be padded to them.
  const auto rows = block_size >= 1 && block_size < 16 ? 16 : block_size;
  return "sdpa dense mask (" + kernel_unsupported(options, heads, kv_heads, head_dim, rows) + ")";
}

at::Tensor dflash_attention(const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx,
                            const at::Tensor& k_blk, const at::Tensor& v_blk,
                            const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
                            const at::Tensor& keep, double scale) {
  const auto blocks = ctx_lo.dim() == 2 ? ctx_lo.size(1) : 0;
#ifdef TANDEM_HAVE_CUDA
  if (kernel_unsupported(q, k_ctx, k_blk, blocks).empty())
    return dflash_attention_fn::apply(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep, scale,
                                      0)[0];
  // Another block size or GQA group in a form the kernels take (kernel_form:
  // zero rows or heads, or repeated kv heads; copies of tens of MB, where
  // the dense path does ≈ 7× the work).
  if (q.dim() == 4 && k_ctx.dim() == 4 && k_blk.dim() == 4 && blocks > 0 && q.size(2) % blocks == 0
      && k_ctx.size(1) > 0 && q.size(1) % k_ctx.size(1) == 0) {
    const auto kv_heads = k_ctx.size(1), bs = q.size(2) / blocks;
    const auto form = kernel_form_for(q.options(), q.size(1), kv_heads, q.size(3), bs, blocks);
    if (form.runs && !form.as_is()) {
      const auto r = form.repeat;
      auto q2 = form.pad_to > 0 ? pad_query_heads(q, kv_heads, form.pad_to) : q;
      auto k2 = r > 1 ? repeat_kv_heads(k_ctx, r) : k_ctx, v2 = r > 1 ? repeat_kv_heads(v_ctx, r) : v_ctx;
      auto kb = r > 1 ? repeat_kv_heads(k_blk, r) : k_blk, vb = r > 1 ? repeat_kv_heads(v_blk, r) : v_blk;
      if (form.pad_rows) {
        q2 = pad_block_rows(q2, blocks);
        kb = pad_block_rows(kb, blocks);
        vb = pad_block_rows(vb, blocks);
      }
      if (kernel_unsupported(q2, k2, kb, blocks).empty()) {
        auto out = dflash_attention_fn::apply(q2, k2, v2, kb, vb, ctx_lo, ctx_hi, keep, scale,
                                              form.pad_rows ? bs : 0)[0];
        if (form.pad_rows)
          out = drop_block_rows(out, blocks, bs);
        return form.pad_to > 0 ? drop_padded_heads(out, kv_heads, q.size(1) / kv_heads) : out;
      }
    }
  }
#else
  (void)blocks;
#endif
  return dflash_attention_dense(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep, scale);
}

dflash_attention_result dflash_attention_forward(const at::Tensor& q, const at::Tensor& k_ctx,
                                                 const at::Tensor& v_ctx, const at::Tensor& k_blk,
                                                 const at::Tensor& v_blk, const at::Tensor& ctx_lo,
                                                 const at::Tensor& ctx_hi, const at::Tensor& keep,
                                                 double scale) {
  const auto m = check_dims(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep);
  const auto why = kernel_unsupported(q, k_ctx, k_blk, m.blocks);
  if (!why.empty())
    throw error(errc::bad_input, "dflash_attention_forward: the kernel does not take these "
                                 "operands (" + why + ")");
#ifdef TANDEM_HAVE_CUDA
  at::NoGradGuard no_grad;
  return kernel_forward(m, kernel_ready(q), kernel_ready(k_ctx), kernel_ready(v_ctx),
                        kernel_ready(k_blk), kernel_ready(v_blk),
                        ranges_for_kernel(ctx_lo, ctx_hi, keep), scale);
#else
  (void)scale;
  return {};
#endif
}

dflash_attention_grads dflash_attention_backward(
  const at::Tensor& q, const at::Tensor& k_ctx, const at::Tensor& v_ctx, const at::Tensor& k_blk,
  const at::Tensor& v_blk, const at::Tensor& ctx_lo, const at::Tensor& ctx_hi,
  const at::Tensor& keep, double scale, const at::Tensor& out, const at::Tensor& lse,
  const at::Tensor& dout) {
  const auto m = check_dims(q, k_ctx, v_ctx, k_blk, v_blk, ctx_lo, ctx_hi, keep);
  const auto why = kernel_unsupported(q, k_ctx, k_blk, m.blocks);
  if (!why.empty())
    throw error(errc::bad_input, "dflash_attention_backward: the kernel does not take these "
                                 "operands (" + why + ")");
  require(out.sizes() == q.sizes() && dout.sizes() == q.sizes()
            && lse.sizes() == at::IntArrayRef({m.batch, m.heads, m.q_len})
            && lse.scalar_type() == at::kFloat,
          "out/dout must match q and lse must be float32 [B, H, Q]");
#ifdef TANDEM_HAVE_CUDA
  at::NoGradGuard no_grad;
  return kernel_backward(m, kernel_ready(q), kernel_ready(k_ctx), kernel_ready(v_ctx),
                         kernel_ready(k_blk), kernel_ready(v_blk),
                         ranges_for_kernel(ctx_lo, ctx_hi, keep), scale, kernel_ready(out), lse,
                         kernel_ready(dout));
#else
  (void)scale; (void)out; (void)lse; (void)dout;
  return {};
#endif
}

causal_chunks causal_chunks_of(const at::Tensor& starts, const at::Tensor& lengths, int64_t s) {
  require(starts.dim() == 2 && starts.sizes() == lengths.sizes(),
          "causal chunks: starts and lengths must be [B, D] alike");
  const auto b = starts.size(0), docs = starts.size(1);
  const int64_t n = (s + 15) / 16 + docs;
  const auto lens = lengths.to(at::kLong).clamp_min(0);
  const auto per_doc = lens.add(15).floor_divide(16);                        // chunks a document
  const auto ends = per_doc.cumsum(1);                                       // [B, D] inclusive
  const auto j = at::arange(n, lens.options()).unsqueeze(0).expand({b, n}).contiguous();
  const auto doc = at::searchsorted(ends, j, /*out_int32=*/false, /*right=*/true);  // [B, N]
  const auto live = doc < docs;
  const auto d = doc.clamp_max(docs - 1);
  const auto first = (ends - per_doc).gather(1, d);  // the document's first chunk
  const auto start = starts.to(at::kLong).gather(1, d);
  const auto row0 = start + (j - first) * 16;
  const auto rows = at::minimum(lens.gather(1, d) - (j - first) * 16, at::full({}, 16, lens.options()));
  const auto zero = at::zeros({}, lens.options());
  causal_chunks c;
  c.row0 = at::where(live, row0, zero).to(at::kInt).contiguous();
  c.rows = at::where(live, rows, zero).to(at::kInt).contiguous();
  c.lo = at::where(live, start, zero).to(at::kInt).contiguous();
  c.hi = c.row0;
  c.keep = live.contiguous();
  return c;
}

std::string causal_chunked_unsupported(const at::TensorOptions& o, int64_t heads, int64_t kv_heads,
                                       int64_t head_dim) {
#ifndef TANDEM_HAVE_CUDA
  (void)o; (void)heads; (void)kv_heads; (void)head_dim;
  return "built without CUDA";
#else
  if (!o.device().is_cuda())
    return "not on CUDA";
  if (c10::typeMetaToScalarType(o.dtype()) != at::kBFloat16)
    return "not bf16";
  if (head_dim != 128 || kv_heads <= 0 || heads % kv_heads != 0 || (heads / kv_heads) % 4 != 0)
    return "head_dim is not 128 or the GQA group not a multiple of 4";
  if (at::cuda::getDeviceProperties(o.device().index())->major != 9)
    return "not sm_90";
  return kernel_unsupported(o, heads, kv_heads, head_dim, 16);
#endif
}

at::Tensor causal_chunked_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                    const causal_chunks& chunks, int64_t s, double scale) {
  require(q.dim() == 3 && k.dim() == 3 && v.sizes() == k.sizes() && q.size(0) == k.size(0)
            && s > 0 && q.size(0) % s == 0 && chunks.row0.dim() == 2
            && chunks.row0.size(0) * s == q.size(0),
          "causal chunks: q " + sizes_text(q) + ", k " + sizes_text(k) + ", v " + sizes_text(v)
            + " do not agree with rows of " + std::to_string(s));
  const auto why = causal_chunked_unsupported(q.options(), q.size(1), k.size(1), q.size(2));
  require(why.empty(), "causal chunks: the kernel does not take these operands (" + why + ")");
#ifdef TANDEM_HAVE_CUDA
  c10::cuda::CUDAGuard guard(q.device());
  const auto b = q.size(0) / s;
  attn_dims m;
  m.batch = b;
  m.heads = q.size(1);
  m.kv_heads = k.size(1);
  m.ctx_len = s;
  m.blocks = chunks.row0.size(1);
  m.block_size = 16;
  m.head_dim = q.size(2);
  // [B·S, heads, d] memory seen as [B, heads, S, d].
  const auto as_bhsd = [&](const at::Tensor& t) {
    return t.unflatten(0, {b, s}).transpose(1, 2);
  };
  auto out = at::empty(q.sizes(), q.options());
  auto lse = at::empty({b, m.heads, s}, q.options().dtype(at::kFloat));
  const auto qv = kernel_ready(as_bhsd(q)), kv = kernel_ready(as_bhsd(k)), vv = kernel_ready(as_bhsd(v));
  kernels::dflash_attention_fwd_args a;
  a.shape = kernel_shape(m, scale, q.scalar_type());
  a.q = in_view(qv);
  a.k_ctx = a.k_blk = in_view(kv);
  a.v_ctx = a.v_blk = in_view(vv);
  a.ranges = {chunks.lo.data_ptr<int32_t>(), chunks.hi.data_ptr<int32_t>(),
              reinterpret_cast<const uint8_t*>(chunks.keep.data_ptr<bool>())};
  a.out = out_view(as_bhsd(out));
  a.lse = lse.data_ptr<float>();
  a.row0 = chunks.row0.data_ptr<int32_t>();
  a.rows = chunks.rows.data_ptr<int32_t>();
  a.q_rows = static_cast<int>(s);
  a.variant = kernel_variant() & forward_variant_bits;  // A/B of the forward's forms
  check_launch(kernels::dflash_attention_forward(a, at::cuda::getCurrentCUDAStream()), "chunked forward");
  return out;
#else
  (void)chunks; (void)scale;
  return {};
#endif
}

} // namespace tandem::gpu
