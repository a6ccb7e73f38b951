// dflash_forward on CUDA with the first layer on its distinct rows (each
// block's anchor and the mask row; make_block_batch gives anchor_embeds and
// mask_embed) against the same forward over every block row (those two left
// undefined): the final hidden states and every weight gradient, fp32 and
// bf16, on layouts drawn by the objective (several documents, padding
// blocks).  Prints "[  SKIPPED ]" without a GPU.
#include <gtest/gtest.h>

#include "gpu/models/dflash.hpp"
#include "gpu/models/dflash_objective.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;
using tandem::gpu::test::rel_err;

namespace {

/// fp32: the two forms differ in GEMM row counts (another cuBLAS kernel, other
/// summation orders) and in the mask rows' gradients summed before the
/// weight-gradient GEMM: a few fp32 roundings of sums of ≤ 10⁴ terms.
constexpr double fp32_rel = 1e-4;
/// bf16: the summed mask-row gradient is rounded to bf16 once (2⁻⁹ ≈ 2e-3)
/// where the GEMM kept fp32 sums; outputs also pass two layers of bf16 math.
constexpr double bf16_rel = 3e-2;

/// A drafter with head_dim 128 (the attention kernels' size), 2 q heads over
/// 1 kv head, hidden 256, intermediate 512, two layers, three taps.
std::pair<dflash_config, dflash_weights> small_drafter(at::ScalarType dtype, int64_t vocab, int64_t bs) {
  const int64_t d = 256, hd = 128, taps = 3;
  dflash_config cfg;
  cfg.layer.hidden_size = d;
  cfg.layer.intermediate_size = 512;
  cfg.layer.num_hidden_layers = 2;
  cfg.layer.num_attention_heads = 2;
  cfg.layer.num_key_value_heads = 1;
  cfg.layer.head_dim = hd;
  cfg.layer.rms_norm_eps = 1e-6;
  cfg.layer.rope_theta = 1e6;
  cfg.layer.vocab_size = vocab;
  cfg.block_size = bs;
  cfg.mask_token_id = vocab - 1;
  cfg.target_layer_ids = {0, 1, 2};
  auto g = gen(3);
  const auto o = at::TensorOptions().dtype(at::kFloat);
  auto r = [&](std::vector<int64_t> s, double scale) { return (at::randn(s, g, o) * scale).to(at::kCUDA, dtype); };
  auto near_one = [&](int64_t n) { return (1 + 0.1 * at::randn({n}, g, o)).to(at::kCUDA, dtype); };
  dflash_weights w;
  w.fc = r({d, taps * d}, 0.03);
  w.hidden_norm = near_one(d);
  w.norm = near_one(d);
  for (int i = 0; i < 2; ++i) {
    decoder_layer_weights l;
    l.input_norm = near_one(d);
    l.post_norm = near_one(d);
    l.q_proj = r({2 * hd, d}, 0.06);
    l.k_proj = r({hd, d}, 0.06);
    l.v_proj = r({hd, d}, 0.06);
    l.o_proj = r({d, 2 * hd}, 0.06);
    l.q_norm = near_one(hd);
    l.k_norm = near_one(hd);
    l.gate_proj = r({512, d}, 0.06);
    l.up_proj = r({512, d}, 0.06);
    l.down_proj = r({d, 512}, 0.04);
    w.layers.push_back(l);
  }
  for (auto& [name, p] : dflash_parameters(w))
    p->requires_grad_(true);
  return {cfg, w};
}

struct result {
  at::Tensor hidden;
  std::vector<std::pair<std::string, at::Tensor>> grads;
};

result run(dflash_weights& w, const dflash_config& cfg, const dflash_inputs& in, const at::Tensor& dy,
           int64_t scored_only) {
  for (auto& [name, p] : dflash_parameters(w))
    p->mutable_grad() = at::Tensor();
  auto h = dflash_forward(w, cfg, in, scored_only);
  (h.to(at::kFloat) * dy).sum().backward();
  result out{h.detach().to(at::kDouble), {}};
  for (auto& [name, p] : dflash_parameters(w))
    out.grads.emplace_back(name, p->grad().to(at::kDouble));
  return out;
}

void check(at::ScalarType dtype) {
  SCOPED_TRACE(::testing::Message() << "dtype " << dtype);
  const int64_t b = 2, s = 300, vocab = 320, bs = 16, n = 12;
  auto [cfg, w] = small_drafter(dtype, vocab, bs);
  auto g = gen(17);
  auto embed = at::randn({vocab, 256}, g) * 0.5;
  auto tokens = at::randint(vocab - 1, {b, s}, g, at::kLong);
  auto loss_mask = at::ones({b, s}, at::kByte);
  loss_mask.narrow(1, 0, 40).zero_();
  loss_mask[1].zero_();
  loss_mask[1].narrow(0, 50, 8).fill_(1);  // row 1: too few anchors, so some of its blocks pad
  // Row 0: two documents; row 1: one short one and the padding document.
  auto docs = make_doc_layout(at::tensor({120, 180, 60, 0}, at::kLong).view({b, 2}), s);
  auto a = sample_anchors(loss_mask, docs, n, bs, gen(4));
  auto batch = make_block_batch(tokens, loss_mask, docs, at::randn({b, s, 3 * 256}, g), a, embed, bs,
                                cfg.mask_token_id, default_gamma(bs));
  ASSERT_FALSE(a.keep.all().item<bool>()) << "the layout should have padding blocks";
  auto& in = batch.inputs;
  for (auto* t : {&in.target_hidden, &in.block_embeds, &in.anchor_embeds, &in.mask_embed})
    *t = t->to(at::kCUDA, dtype);
  for (auto* t : {&in.ctx_positions, &in.block_positions, &in.ctx_lo, &in.ctx_hi, &in.keep})
    *t = t->to(at::kCUDA);
  in.visible = at::Tensor();
  ASSERT_TRUE(batch.inputs.anchor_embeds.defined() && batch.inputs.mask_embed.defined());
  ASSERT_FALSE(batch.inputs.block_embeds.requires_grad());
  auto every_row = batch.inputs;
  every_row.anchor_embeds = at::Tensor();
  every_row.mask_embed = at::Tensor();
  const double tol = dtype == at::kFloat ? fp32_rel : bf16_rel;
  for (int64_t scored_only : {int64_t{0}, bs}) {
    SCOPED_TRACE(::testing::Message() << "scored_only " << scored_only);
    const auto rows = scored_only ? n * (bs - 1) : n * bs;
    auto dy = at::randn({b, rows, 256}, gen(23)).to(at::kCUDA);
    auto distinct = run(w, cfg, batch.inputs, dy, scored_only);
    auto full = run(w, cfg, every_row, dy, scored_only);
    EXPECT_LE(rel_err(distinct.hidden, full.hidden), tol);
    for (size_t i = 0; i < full.grads.size(); ++i)
      EXPECT_LE(rel_err(distinct.grads[i].second, full.grads[i].second), tol) << full.grads[i].first;
  }
  // The distinct-row path is the one that ran: it checks its operands' shapes.
  auto wrong = batch.inputs;
  wrong.anchor_embeds = batch.inputs.anchor_embeds.narrow(1, 0, n - 1);
  EXPECT_THROW(dflash_forward(w, cfg, wrong), c10::Error);
}

} // namespace

TEST(dflash_forward, cuda_first_layer_on_distinct_rows_matches_every_row) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check(at::kFloat);
  check(at::kBFloat16);
}
