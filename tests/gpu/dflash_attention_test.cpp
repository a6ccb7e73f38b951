// dflash_attention (gpu/models/dflash_attention.hpp) against an independent
// reference: explicit masked softmax attention through autograd, over the
// dense `visible` mask that make_block_batch builds (padding rows cleared),
// on layouts drawn by the objective itself (several documents a row, anchors
// at a document's first token, so empty context ranges, padding blocks, S
// not a multiple of any tile).  The CPU cases run everywhere (the dense SDPA
// fallback); the CUDA cases print "[  SKIPPED ]" without a GPU.
#include <cmath>
#include <limits>

#include <gtest/gtest.h>

#include "gpu/models/dflash_objective.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

#ifdef TANDEM_HAVE_CUDA
#include <ATen/cuda/CUDAGraph.h>
#endif

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;
using tandem::gpu::test::rel_err;

namespace {

// Tolerances on ‖ours − ref‖ / ‖ref‖ (relative Frobenius error).
/// float32 fallback vs the float64 reference: float32 rounding over sums of
/// a few hundred terms stays ~1e-7..1e-6.
constexpr double fp32_rel = 1e-5;
/// bf16 kernel vs the float32 reference on the same bf16 inputs: bf16 keeps
/// 8 mantissa bits (2^-9 ≈ 2e-3 a rounding), and P / dS are rounded to bf16
/// before their second matmul; an H200 measured 2.0e-3..2.7e-3 on every
/// output (tests/gpu/dflash_attention_harness.py).  Indexing or masking
/// errors give O(1).
constexpr double bf16_out_rel = 1e-2;
constexpr double bf16_grad_rel = 2e-2;
/// Log-sum-exp is accumulated in float32 from float32 scores: ~1e-7.
constexpr double lse_rel = 1e-3;

constexpr int64_t block_size = 16;

/// One layout drawn the way the objective draws it.
struct layout_case {
  at::Tensor ctx_lo, ctx_hi, keep;  ///< [B, N] from make_block_batch
  at::Tensor visible;               ///< [B, 1, Q, S + Q] from make_block_batch
  int64_t ctx_len = 0, blocks = 0;
  int64_t bs = block_size;          ///< rows a block
};

/// `docs` documents a row at random cuts; the loss mask covers the last
/// (1 − frac[b]) of each document and its first token (an anchor there has
/// no context: an empty range); N anchors a row through sample_anchors, so
/// a row with fewer candidates than N gets padding blocks.
layout_case objective_layout(int64_t s, int64_t n, int64_t docs, const std::vector<double>& frac,
                             uint64_t seed, int64_t bs = block_size) {
  const auto b = static_cast<int64_t>(frac.size());
  auto g = gen(seed);
  auto lengths = at::zeros({b, docs}, at::kLong);
  for (int64_t r = 0; r < b; ++r) {
    auto cuts = std::get<0>(at::sort((at::randperm(s - 1, g) + 1).narrow(0, 0, docs - 1)));
    int64_t prev = 0;
    for (int64_t k = 0; k < docs; ++k) {
      const auto cut = k + 1 < docs ? cuts[k].item<int64_t>() : s;
      lengths[r][k] = cut - prev;
      prev = cut;
    }
  }
  auto layout = make_doc_layout(lengths, s);
  auto idx = at::arange(s, at::kLong).unsqueeze(0);
  auto f = at::tensor(frac, at::kDouble).unsqueeze(1);
  auto len = (layout.end - layout.start).to(at::kDouble);
  auto loss_mask = (((idx - layout.start).to(at::kDouble) >= f * len) | (idx == layout.start)).to(at::kByte);
  auto a = sample_anchors(loss_mask, layout, n, bs, g);
  auto batch = make_block_batch(at::zeros({b, s}, at::kLong), loss_mask, layout,
                                at::zeros({b, s, 1}), a, at::zeros({2, 1}), bs, 1, 7.0);
  return {batch.inputs.ctx_lo, batch.inputs.ctx_hi, batch.inputs.keep, batch.inputs.visible, s, n, bs};
}

/// The mask the reference uses: make_block_batch's `visible` with the rows
/// of padding blocks cleared (a padding block sees nothing).
at::Tensor reference_mask(const layout_case& c) {
  auto rows = c.keep.repeat_interleave(c.bs, 1);  // [B, Q]
  return c.visible & rows.unsqueeze(1).unsqueeze(3);
}

struct operands {
  at::Tensor q, k_ctx, v_ctx, k_blk, v_blk, dout;
};

/// Random operands in the drafter's layout: [B, T, heads, d] memory seen as
/// [B, heads, T, d].
operands random_operands(const layout_case& c, int64_t heads, int64_t kv_heads, int64_t d,
                         at::ScalarType dtype, at::Device dev, uint64_t seed) {
  auto g = gen(seed);
  const auto b = c.ctx_lo.size(0), q_len = c.blocks * c.bs;
  auto r = [&](int64_t h, int64_t t) {
    return at::randn({b, t, h, d}, g).to(dev, dtype).transpose(1, 2);
  };
  operands o;
  o.q = r(heads, q_len);
  o.k_ctx = r(kv_heads, c.ctx_len);
  o.v_ctx = r(kv_heads, c.ctx_len);
  o.k_blk = r(kv_heads, q_len);
  o.v_blk = r(kv_heads, q_len);
  o.dout = r(heads, q_len);
  return o;
}

struct attention_result {
  at::Tensor out, lse;
  std::vector<at::Tensor> grads;  ///< dq, dk_ctx, dv_ctx, dk_blk, dv_blk
};

/// Explicit masked-softmax attention in `dtype`, through autograd.
attention_result reference(const operands& o, const at::Tensor& mask, double scale,
                           at::ScalarType dtype) {
  std::vector<at::Tensor> leaves;
  for (const auto* t : {&o.q, &o.k_ctx, &o.v_ctx, &o.k_blk, &o.v_blk})
    leaves.push_back(t->detach().to(dtype).requires_grad_(true));
  const auto group = o.q.size(1) / o.k_ctx.size(1);
  auto k = at::cat({leaves[1], leaves[3]}, 2).repeat_interleave(group, 1);
  auto v = at::cat({leaves[2], leaves[4]}, 2).repeat_interleave(group, 1);
  auto s = at::matmul(leaves[0], k.transpose(-1, -2)) * scale;
  s = s.masked_fill(~mask.to(s.device()), -std::numeric_limits<double>::infinity());
  auto lse = at::logsumexp(s, -1);
  auto p = at::exp(s - at::where(at::isfinite(lse), lse, at::zeros({}, lse.options())).unsqueeze(-1));
  auto out = at::matmul(p, v);
  out.backward(o.dout.to(dtype));
  attention_result r{out.detach(), lse.detach(), {}};
  for (auto& l : leaves)
    r.grads.push_back(l.grad());
  return r;
}

/// dflash_attention through autograd (whatever path it takes).
attention_result ours(const operands& o, const layout_case& c, double scale) {
  std::vector<at::Tensor> leaves;
  for (const auto* t : {&o.q, &o.k_ctx, &o.v_ctx, &o.k_blk, &o.v_blk})
    leaves.push_back(t->detach().requires_grad_(true));
  const auto dev = o.q.device();
  auto out = dflash_attention(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4],
                              c.ctx_lo.to(dev), c.ctx_hi.to(dev), c.keep.to(dev), scale);
  out.backward(o.dout);
  attention_result r{out.detach(), {}, {}};
  for (auto& l : leaves)
    r.grads.push_back(l.grad());
  return r;
}

const char* grad_names[] = {"dq", "dk_ctx", "dv_ctx", "dk_blk", "dv_blk"};

void expect_close(const attention_result& got, const attention_result& ref, double out_tol,
                  double grad_tol) {
  const double e = rel_err(got.out, ref.out);
  EXPECT_LE(e, out_tol) << "out";
  std::printf("  out     rel err %.3e (tolerance %.0e)\n", e, out_tol);
  for (size_t i = 0; i < 5; ++i) {
    ASSERT_TRUE(got.grads[i].defined()) << grad_names[i];
    EXPECT_TRUE(at::isfinite(got.grads[i]).all().item<bool>()) << grad_names[i];
    const double ge = rel_err(got.grads[i], ref.grads[i]);
    EXPECT_LE(ge, grad_tol) << grad_names[i];
    std::printf("  %-7s rel err %.3e (tolerance %.0e)\n", grad_names[i], ge, grad_tol);
  }
}

/// Padding rows: output and dq exactly zero.
void expect_padding_zero(const attention_result& got, const layout_case& c) {
  auto pad = (~c.keep).repeat_interleave(c.bs, 1).to(got.out.device());  // [B, Q]
  if (!pad.any().item<bool>())
    return;
  auto rows = got.out.transpose(1, 2).index({pad});  // [rows, H, d]
  EXPECT_EQ(rows.abs().max().item<double>(), 0.0) << "padding output rows are exactly 0";
  auto dq = got.grads[0].transpose(1, 2).index({pad});
  EXPECT_EQ(dq.abs().max().item<double>(), 0.0) << "padding rows send no gradient";
}

struct shape_case {
  const char* name;
  int64_t s, n, docs, heads, kv_heads, d;
  std::vector<double> frac;
};

/// Small and mid shapes; the second row of each has few candidates, so it
/// ends in padding blocks.  S is no multiple of 16, 32, 64 or 128.
std::vector<shape_case> cases(bool gpu) {
  return {{"small", 37, 5, 2, 4, 2, gpu ? 64 : 16, {0.5, 0.9}},
          {"mid", gpu ? 1000 : 300, gpu ? 64 : 24, 3, 8, 2, gpu ? 128 : 32, {0.5, 0.93}}};
}

} // namespace

TEST(dflash_attention, ranges_are_the_objectives_visible_mask) {
  // The layouts of every case below (CPU and CUDA seeds alike).
  std::vector<std::pair<shape_case, uint64_t>> all;
  for (const auto& sc : cases(false))
    all.emplace_back(sc, 5);
  for (const auto& sc : cases(true))
    all.emplace_back(sc, 7);
  for (const auto& [sc, seed] : all) {
    SCOPED_TRACE(std::string(sc.name) + " S " + std::to_string(sc.s));
    auto c = objective_layout(sc.s, sc.n, sc.docs, sc.frac, seed);
    ASSERT_EQ(c.ctx_lo.scalar_type(), at::kInt);
    ASSERT_EQ(c.keep.scalar_type(), at::kBool);
    auto ours = dflash_visible_mask(c.ctx_lo, c.ctx_hi, c.keep, c.ctx_len, block_size);
    ASSERT_EQ(ours.sizes(), c.visible.sizes());
    // Context keys: identical everywhere, padding blocks included.
    EXPECT_TRUE(at::equal(ours.narrow(3, 0, c.ctx_len), c.visible.narrow(3, 0, c.ctx_len)));
    // Block keys: identical on kept blocks; a padding block sees nothing
    // here, while `visible` lets it see its own block (SDPA-safe form).
    auto rows = c.keep.repeat_interleave(block_size, 1).unsqueeze(1).unsqueeze(3);
    EXPECT_TRUE(at::equal(ours, c.visible & rows));
    EXPECT_FALSE(ours.masked_select(~rows).any().item<bool>());
    EXPECT_TRUE(c.keep.logical_not().any().item<bool>()) << "the case has padding blocks";
    EXPECT_TRUE((c.keep & (c.ctx_lo == c.ctx_hi)).any().item<bool>())
      << "the case has kept blocks with an empty context range";
    // Sorted anchors: ctx_hi never decreases over a row's kept blocks.
    for (int64_t r = 0; r < c.keep.size(0); ++r) {
      auto hi = c.ctx_hi[r].masked_select(c.keep[r]);
      if (hi.numel() > 1)
        EXPECT_TRUE((hi.narrow(0, 1, hi.numel() - 1) >= hi.narrow(0, 0, hi.numel() - 1))
                      .all()
                      .item<bool>());
    }
  }
}

TEST(dflash_attention, cpu_fallback_matches_float64_reference) {
  for (const auto& sc : cases(false)) {
    SCOPED_TRACE(sc.name);
    std::printf("%s: S %ld N %ld H %ld/%ld d %ld\n", sc.name, long(sc.s), long(sc.n),
                long(sc.heads), long(sc.kv_heads), long(sc.d));
    auto c = objective_layout(sc.s, sc.n, sc.docs, sc.frac, 5);
    auto o = random_operands(c, sc.heads, sc.kv_heads, sc.d, at::kFloat, at::kCPU, 6);
    EXPECT_EQ(dflash_attention_path(o.q.options(), sc.heads, sc.kv_heads, sc.d, block_size)
                .rfind("sdpa dense mask", 0),
              0u);
    const double scale = 1.0 / std::sqrt(double(sc.d));
    auto ref = reference(o, reference_mask(c), scale, at::kDouble);
    auto got = ours(o, c, scale);
    expect_close(got, ref, fp32_rel, fp32_rel);
    expect_padding_zero(got, c);
  }
}

TEST(dflash_attention, cuda_kernel_matches_float32_reference) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  for (const auto& sc : cases(true)) {
    SCOPED_TRACE(sc.name);
    std::printf("%s: S %ld N %ld H %ld/%ld d %ld, bf16\n", sc.name, long(sc.s), long(sc.n),
                long(sc.heads), long(sc.kv_heads), long(sc.d));
    auto c = objective_layout(sc.s, sc.n, sc.docs, sc.frac, 7);
    auto o = random_operands(c, sc.heads, sc.kv_heads, sc.d, at::kBFloat16, dev, 8);
    ASSERT_EQ(dflash_attention_path(o.q.options(), sc.heads, sc.kv_heads, sc.d, block_size),
              "cuda kernel");
    const double scale = 1.0 / std::sqrt(double(sc.d));
    auto ref = reference(o, reference_mask(c), scale, at::kFloat);
    auto got = ours(o, c, scale);
    expect_close(got, ref, bf16_out_rel, bf16_grad_rel);
    expect_padding_zero(got, c);
    EXPECT_TRUE(at::isfinite(got.out).all().item<bool>());

    // The explicit entry points: the same output, the LSE, and a backward
    // that is bit-for-bit repeatable (no atomics).
    auto lo = c.ctx_lo.to(dev), hi = c.ctx_hi.to(dev), keep = c.keep.to(dev);
    auto fw = dflash_attention_forward(o.q, o.k_ctx, o.v_ctx, o.k_blk, o.v_blk, lo, hi, keep, scale);
    EXPECT_TRUE(at::equal(fw.out, got.out));
    auto finite = at::isfinite(ref.lse);
    EXPECT_TRUE(at::equal(at::isfinite(fw.lse), finite)) << "−inf exactly on padding rows";
    const double le = rel_err(fw.lse.masked_select(finite), ref.lse.masked_select(finite));
    EXPECT_LE(le, lse_rel);
    std::printf("  lse     rel err %.3e (tolerance %.0e)\n", le, lse_rel);
    auto g1 = dflash_attention_backward(o.q, o.k_ctx, o.v_ctx, o.k_blk, o.v_blk, lo, hi, keep,
                                        scale, fw.out, fw.lse, o.dout);
    auto g2 = dflash_attention_backward(o.q, o.k_ctx, o.v_ctx, o.k_blk, o.v_blk, lo, hi, keep,
                                        scale, fw.out, fw.lse, o.dout);
    EXPECT_TRUE(at::equal(g1.dq, g2.dq) && at::equal(g1.dk_ctx, g2.dk_ctx)
                && at::equal(g1.dv_ctx, g2.dv_ctx) && at::equal(g1.dk_blk, g2.dk_blk)
                && at::equal(g1.dv_blk, g2.dv_blk));
    EXPECT_TRUE(at::equal(g1.dq, got.grads[0]) && at::equal(g1.dk_ctx, got.grads[1]));
  }
}

TEST(dflash_attention, cuda_unsupported_operands_fall_back_to_dense) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  auto c = objective_layout(37, 5, 2, {0.5, 0.9}, 9);
  // float32 and head_dim 16 (the parity fixtures' drafter): no kernel.
  for (auto [dtype, d] : {std::pair{at::kFloat, int64_t{64}}, std::pair{at::kBFloat16, int64_t{16}}}) {
    auto o = random_operands(c, 4, 2, d, dtype, dev, 10);
    const auto path = dflash_attention_path(o.q.options(), 4, 2, d, block_size);
    EXPECT_EQ(path.rfind("sdpa dense mask", 0), 0u) << path;
    const double scale = 1.0 / std::sqrt(double(d));
    auto ref = reference(o, reference_mask(c), scale, at::kFloat);
    auto got = ours(o, c, scale);
    const double tol = dtype == at::kFloat ? 1e-4 : bf16_grad_rel;  // CUDA SDPA in fp32: ~1e-6
    expect_close(got, ref, tol, tol);
    expect_padding_zero(got, c);
    // Repeatable bit for bit (masked_attention: SDPA's memory-efficient
    // backward would sum dQ with atomics in whatever order they land).
    auto again = ours(o, c, scale);
    EXPECT_TRUE(at::equal(got.out, again.out)) << path;
    for (size_t i = 0; i < got.grads.size(); ++i)
      EXPECT_TRUE(at::equal(got.grads[i], again.grads[i])) << path << ": gradient " << i;
  }
}

namespace {

/// The drafter reads the output as out.transpose(1, 2).reshape({B, Q, H·d})
/// for o_proj: a view on every path (no copy of the output).
void expect_output_reshapes_as_a_view(const at::Tensor& out) {
  const auto flat = out.transpose(1, 2).reshape({out.size(0), out.size(2), out.size(1) * out.size(3)});
  EXPECT_TRUE(flat.is_alias_of(out)) << "the output's [B, Q, H·d] reshape copied";
}

#ifdef TANDEM_HAVE_CUDA
/// run() warmed up on a side stream, captured in a CUDA graph there and the
/// graph replayed once: what the replay wrote (CUDA builds).
template <typename F>
auto replayed_in_a_graph(const at::Device& dev, F run) -> decltype(run()) {
  auto side = c10::cuda::getStreamFromPool(false, dev.index());
  decltype(run()) captured;
  at::cuda::CUDAGraph graph;
  c10::cuda::CUDAStreamGuard guard(side);
  (void)run();  // warm-up on the capture stream
  side.synchronize();
  graph.capture_begin();
  captured = run();
  graph.capture_end();
  graph.replay();
  side.synchronize();
  return captured;
}

#endif

/// A bf16 kernel path against the float32 reference: every output the
/// shape of its input, the output's reshape a view, within the bf16
/// tolerances, padding blocks exactly zero, repeatable bit for bit.
void expect_kernel_path_matches_reference(const operands& o, const layout_case& c, double scale) {
  auto ref = reference(o, reference_mask(c), scale, at::kFloat);
  auto got = ours(o, c, scale);
  ASSERT_EQ(got.out.sizes(), o.q.sizes());
  const at::Tensor* inputs[] = {&o.q, &o.k_ctx, &o.v_ctx, &o.k_blk, &o.v_blk};
  for (size_t i = 0; i < 5; ++i)
    ASSERT_EQ(got.grads[i].sizes(), inputs[i]->sizes()) << grad_names[i];
  expect_output_reshapes_as_a_view(got.out);
  expect_close(got, ref, bf16_out_rel, bf16_grad_rel);
  expect_padding_zero(got, c);
  auto again = ours(o, c, scale);
  EXPECT_TRUE(at::equal(got.out, again.out));
  for (size_t i = 0; i < got.grads.size(); ++i)
    EXPECT_TRUE(at::equal(got.grads[i], again.grads[i])) << "gradient " << i;
}

} // namespace

TEST(dflash_attention, cuda_kernel_takes_other_gqa_groups_with_kv_heads_repeated) {
  // The kernels take GQA groups of 1, 2, 4 and 8; another group (Qwen3-14B's
  // 40/8 = 5) repeats each kv head into one they take instead of falling
  // back to the dense mask.  Against the float32 reference (whose kv heads
  // are shared the same way), gradients of the repeated heads summed back,
  // and bit-for-bit repeatable.
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  auto c = objective_layout(300, 24, 3, {0.5, 0.93}, 13);
  struct group_case {
    int64_t heads, kv_heads, repeat;
  };
  for (auto g : {group_case{10, 2, 5}, group_case{6, 1, 3}, group_case{12, 1, 3}, group_case{3, 1, 3}}) {
    SCOPED_TRACE("heads " + std::to_string(g.heads) + "/" + std::to_string(g.kv_heads));
    auto o = random_operands(c, g.heads, g.kv_heads, 64, at::kBFloat16, dev, 14);
    const auto path = dflash_attention_path(o.q.options(), g.heads, g.kv_heads, 64, block_size);
    std::printf("heads %ld/%ld: %s\n", long(g.heads), long(g.kv_heads), path.c_str());
    EXPECT_EQ(path.rfind("cuda kernel (kv heads repeated " + std::to_string(g.repeat) + "x", 0), 0u) << path;
    expect_kernel_path_matches_reference(o, c, 1.0 / std::sqrt(64.0));
  }
}

TEST(dflash_attention, cuda_kernel_pads_query_heads_of_other_gqa_groups_on_hopper) {
  // At head_dim 128 on sm_90 a group the kernels do not take (5, 3, 6, 7)
  // gets zero query heads up to a multiple of 4 and its kv heads repeated
  // into groups of 4, the kernels' wgmma path; a group
  // that is already a multiple of 4 (12) only repeats its kv heads.  Output
  // and every gradient against the float32 reference, the padded heads
  // adding nothing, q's gradient of q's shape, repeatable bit for bit.
  // Elsewhere (not sm_90) the kv heads are repeated, as the test above.
#ifndef TANDEM_HAVE_CUDA
  GTEST_SKIP() << "SKIPPED: built without CUDA";
#else
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  const bool hopper = at::cuda::getDeviceProperties(0)->major == 9;
  auto c = objective_layout(300, 24, 3, {0.5, 0.93}, 17);
  struct group_case {
    int64_t heads, kv_heads;
    std::string hopper_path, other_path;
  };
  const std::string padded = "cuda kernel (query heads padded to a group of ";
  for (const auto& g :
       {group_case{10, 2, padded + "8, kv heads repeated 2x: GQA group 5)",
                   "cuda kernel (kv heads repeated 5x: GQA group 5)"},
        group_case{6, 2, padded + "4: GQA group 3)", "cuda kernel (kv heads repeated 3x: GQA group 3)"},
        group_case{6, 1, padded + "8, kv heads repeated 2x: GQA group 6)",
                   "cuda kernel (kv heads repeated 3x: GQA group 6)"},
        group_case{7, 1, padded + "8, kv heads repeated 2x: GQA group 7)",
                   "cuda kernel (kv heads repeated 7x: GQA group 7)"},
        group_case{12, 1, "cuda kernel (kv heads repeated 3x: GQA group 12)",
                   "cuda kernel (kv heads repeated 3x: GQA group 12)"}}) {
    SCOPED_TRACE("heads " + std::to_string(g.heads) + "/" + std::to_string(g.kv_heads));
    auto o = random_operands(c, g.heads, g.kv_heads, 128, at::kBFloat16, dev, 18);
    const auto path = dflash_attention_path(o.q.options(), g.heads, g.kv_heads, 128, block_size);
    std::printf("heads %ld/%ld, head_dim 128: %s\n", long(g.heads), long(g.kv_heads), path.c_str());
    EXPECT_EQ(path, hopper ? g.hopper_path : g.other_path);
    expect_kernel_path_matches_reference(o, c, 1.0 / std::sqrt(128.0));
  }
#endif
}

TEST(dflash_attention, cuda_kernel_takes_block_sizes_below_16_as_padded_blocks) {
  // DFlash also trains blocks of 8 and 10: each block runs as 16 rows (its
  // own rows, then zero rows whose keys the kernels leave unseen), instead
  // of the dense-mask path.  Output and every gradient against the float32
  // reference, padding blocks exactly zero, repeatable bit for bit; with a
  // GQA group of 5 at head_dim 128 (padded heads on sm_90) as well, that
  // case also captured in a CUDA graph and replayed to the same bits.
#ifndef TANDEM_HAVE_CUDA
  GTEST_SKIP() << "SKIPPED: built without CUDA";
#else
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  const bool hopper = at::cuda::getDeviceProperties(0)->major == 9;
  struct bs_case {
    int64_t bs, heads, kv_heads, d;
    std::string path;
  };
  const std::string g5 = hopper ? "query heads padded to a group of 8, kv heads repeated 2x: GQA group 5"
                                : "kv heads repeated 5x: GQA group 5";
  for (const auto& k : {bs_case{8, 8, 2, 64, "cuda kernel (blocks of 8 rows padded to 16)"},
                        bs_case{10, 8, 2, 128, "cuda kernel (blocks of 10 rows padded to 16)"},
                        bs_case{2, 4, 1, 64, "cuda kernel (blocks of 2 rows padded to 16)"},
                        bs_case{10, 10, 2, 128, "cuda kernel (blocks of 10 rows padded to 16; " + g5 + ")"}}) {
    SCOPED_TRACE("block size " + std::to_string(k.bs) + ", heads " + std::to_string(k.heads) + "/"
                 + std::to_string(k.kv_heads) + ", d " + std::to_string(k.d));
    auto c = objective_layout(300, 24, 3, {0.5, 0.93}, 19, k.bs);
    ASSERT_TRUE(c.keep.logical_not().any().item<bool>()) << "the case has padding blocks";
    auto o = random_operands(c, k.heads, k.kv_heads, k.d, at::kBFloat16, dev, 20);
    const auto path = dflash_attention_path(o.q.options(), k.heads, k.kv_heads, k.d, k.bs);
    std::printf("block size %ld, heads %ld/%ld, head_dim %ld: %s\n", long(k.bs), long(k.heads),
                long(k.kv_heads), long(k.d), path.c_str());
    EXPECT_EQ(path, k.path);
    const double scale = 1.0 / std::sqrt(double(k.d));
    expect_kernel_path_matches_reference(o, c, scale);
    if (k.bs != 10 || k.heads != 10)
      continue;
    // Captured in a CUDA graph, as the drafter's whole step is: the padded
    // forms (rows and, on sm_90, heads) replay to the eager bits.
    std::vector<at::Tensor> leaves;
    for (const auto* t : {&o.q, &o.k_ctx, &o.v_ctx, &o.k_blk, &o.v_blk})
      leaves.push_back(t->detach().requires_grad_(true));
    auto lo = c.ctx_lo.to(dev), hi = c.ctx_hi.to(dev), keep = c.keep.to(dev);
    auto run = [&] {
      auto out = dflash_attention(leaves[0], leaves[1], leaves[2], leaves[3], leaves[4], lo, hi, keep, scale);
      auto grads = torch::autograd::grad({out}, leaves, {o.dout});
      grads.insert(grads.begin(), out.detach());
      return grads;
    };
    const auto eager = run();
    const auto captured = replayed_in_a_graph(dev, run);
    ASSERT_EQ(captured.size(), eager.size());
    for (size_t i = 0; i < eager.size(); ++i)
      EXPECT_TRUE(at::equal(captured[i], eager[i])) << "replayed output/gradient " << i;
  }
#endif
}

TEST(dflash_attention, cuda_forward_and_backward_replay_in_a_graph) {
#ifndef TANDEM_HAVE_CUDA
  GTEST_SKIP() << "SKIPPED: built without CUDA";
#else
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  const at::Device dev(at::kCUDA, 0);
  auto c = objective_layout(1000, 64, 3, {0.5, 0.93}, 11);
  auto o = random_operands(c, 8, 2, 128, at::kBFloat16, dev, 12);
  auto lo = c.ctx_lo.to(dev), hi = c.ctx_hi.to(dev), keep = c.keep.to(dev);
  const double scale = 1.0 / std::sqrt(128.0);
  auto run = [&] {
    auto fw = dflash_attention_forward(o.q, o.k_ctx, o.v_ctx, o.k_blk, o.v_blk, lo, hi, keep, scale);
    auto g = dflash_attention_backward(o.q, o.k_ctx, o.v_ctx, o.k_blk, o.v_blk, lo, hi, keep,
                                       scale, fw.out, fw.lse, o.dout);
    return std::pair{fw, g};
  };
  auto eager = run();
  const auto captured = replayed_in_a_graph(dev, run);
  EXPECT_TRUE(at::equal(captured.first.out, eager.first.out));
  EXPECT_TRUE(at::equal(captured.first.lse, eager.first.lse));
  EXPECT_TRUE(at::equal(captured.second.dq, eager.second.dq));
  EXPECT_TRUE(at::equal(captured.second.dk_ctx, eager.second.dk_ctx));
  EXPECT_TRUE(at::equal(captured.second.dv_ctx, eager.second.dv_ctx));
  EXPECT_TRUE(at::equal(captured.second.dk_blk, eager.second.dk_blk));
  EXPECT_TRUE(at::equal(captured.second.dv_blk, eager.second.dv_blk));
#endif
}
