// DFlash objective pieces that need no reference package: anchor sampling
// properties, padding safety, and the chunked cross-entropy against plain
// LibTorch cross-entropy (forward and gradient) for several chunk sizes, and
// the scored rows (positions 1 … Bs−1) against every row; the forward that
// skips the unscored rows in its last layer against the full one, and
// fused_linear_residual against residual + linear (float64).
#include <gtest/gtest.h>

#include "gpu/models/dflash_objective.hpp"
#include "gpu/models/flops.hpp"
#include "gpu/models/linear.hpp"
#include "gpu/pch.hpp"

using namespace tandem::gpu;

namespace {

at::Generator gen(uint64_t seed) {
  return at::make_generator<at::CPUGeneratorImpl>(seed);
}

/// A small drafter (hidden 16, 2 heads over 1 kv head of 8, intermediate 32,
/// two taps, vocabulary 40) with `layers` random layers of `dtype`.
std::pair<dflash_config, dflash_weights> tiny_drafter(at::Generator& g, int64_t layers, int64_t bs,
                                                      at::ScalarType dtype = at::kFloat) {
  const int64_t d = 16, taps = 2, v = 40;
  dflash_config cfg;
  cfg.layer.hidden_size = d;
  cfg.layer.intermediate_size = 32;
  cfg.layer.num_hidden_layers = layers;
  cfg.layer.num_attention_heads = 2;
  cfg.layer.num_key_value_heads = 1;
  cfg.layer.head_dim = 8;
  cfg.layer.rms_norm_eps = 1e-6;
  cfg.layer.rope_theta = 10000;
  cfg.layer.vocab_size = v;
  cfg.block_size = bs;
  cfg.mask_token_id = v - 1;
  cfg.target_layer_ids = {0, 1};
  const auto o = at::TensorOptions().dtype(dtype);
  dflash_weights w;
  w.fc = at::randn({d, taps * d}, g, o) * 0.2;
  w.hidden_norm = at::ones({d}, o);
  w.norm = at::ones({d}, o);
  for (int64_t i = 0; i < layers; ++i) {
    decoder_layer_weights l;
    l.input_norm = at::ones({d}, o);
    l.post_norm = at::ones({d}, o);
    l.q_proj = at::randn({16, d}, g, o) * 0.2;
    l.k_proj = at::randn({8, d}, g, o) * 0.2;
    l.v_proj = at::randn({8, d}, g, o) * 0.2;
    l.o_proj = at::randn({d, 16}, g, o) * 0.2;
    l.q_norm = at::ones({8}, o);
    l.k_norm = at::ones({8}, o);
    l.gate_proj = at::randn({32, d}, g, o) * 0.2;
    l.up_proj = at::randn({32, d}, g, o) * 0.2;
    l.down_proj = at::randn({d, 32}, g, o) * 0.2;
    w.layers.push_back(l);
  }
  for (auto& [name, p] : dflash_parameters(w))
    p->requires_grad_(true);
  return {cfg, w};
}

} // namespace

TEST(objective, anchors_are_sorted_unique_candidates_within_documents) {
  const int64_t b = 3, s = 64, bs = 8, n = 6;
  auto g = gen(7);
  auto loss_mask = (at::rand({b, s}, g) > 0.3).to(at::kByte);
  auto docs = make_doc_layout(at::tensor({30, 34, 64, 0, 10, 20}, at::kLong).view({b, 2}), s);
  for (uint64_t seed : {1, 2, 3}) {
    auto a = sample_anchors(loss_mask, docs, n, bs, gen(seed));
    for (int64_t r = 0; r < b; ++r) {
      std::vector<int64_t> candidates;
      for (int64_t i = 0; i < s; ++i)
        if (loss_mask[r][i].item<int>() && i <= s - bs && i + 1 < docs.end[r][i].item<int64_t>())
          candidates.push_back(i);
      const auto want = std::min<int64_t>(n, std::max<int64_t>(0, candidates.size() - 1));
      EXPECT_EQ(a.keep[r].sum().item<int64_t>(), want);
      int64_t prev = -1;
      for (int64_t j = 0; j < want; ++j) {
        EXPECT_TRUE(a.keep[r][j].item<bool>()) << "kept slots come first";
        const auto x = a.anchors[r][j].item<int64_t>();
        EXPECT_GT(x, prev) << "sorted, no repeats";
        EXPECT_NE(std::find(candidates.begin(), candidates.end(), x), candidates.end());
        prev = x;
      }
    }
  }
  auto a1 = sample_anchors(loss_mask, docs, n, bs, gen(11));
  auto a2 = sample_anchors(loss_mask, docs, n, bs, gen(11));
  auto a3 = sample_anchors(loss_mask, docs, n, bs, gen(12));
  EXPECT_TRUE(at::equal(a1.anchors, a2.anchors)) << "same seed, same anchors";
  EXPECT_FALSE(at::equal(a1.anchors, a3.anchors)) << "another seed, other anchors";
}

TEST(objective, more_slots_than_positions_is_padded) {
  auto loss_mask = at::ones({1, 10}, at::kByte);
  auto docs = whole_row_layout(1, 10, at::kCPU);
  auto a = sample_anchors(loss_mask, docs, 32, 4, gen(1));
  EXPECT_EQ(a.anchors.size(1), 32);
  EXPECT_EQ(a.keep.sum().item<int64_t>(), 6);  // candidates 0..6, take count − 1
}

TEST(objective, chunked_cross_entropy_equals_plain_for_any_chunking) {
  auto g = gen(5);
  const int64_t rows = 37, d = 16, v = 50;
  auto hidden0 = at::randn({rows, d}, g, at::kDouble);
  auto head = at::randn({v, d}, g, at::kDouble);
  auto labels = at::randint(v, {rows}, g, at::kLong);
  auto mask = (at::rand({rows}, g, at::kDouble) > 0.3).to(at::kDouble);
  auto weight = mask * at::rand({rows}, g, at::kDouble);

  auto h_ref = hidden0.clone().requires_grad_(true);
  auto logits = at::matmul(h_ref, head.t());
  auto ref = (at::cross_entropy_loss(logits, labels, {}, at::Reduction::None) * weight).sum();
  ref.backward();
  auto hits_ref = ((logits.argmax(1) == labels).to(at::kDouble) * mask).sum();

  for (int64_t chunk : {1, 5, 36, 37, 1000}) {
    SCOPED_TRACE(chunk);
    auto h = hidden0.clone().requires_grad_(true);
    auto out = chunked_cross_entropy(h, head, labels, weight, mask, chunk);
    // The CE accumulates in float32 by design; compare at float32 precision.
    EXPECT_NEAR(out.weighted_ce.item<double>(), ref.item<double>(), 1e-4 * std::abs(ref.item<double>()));
    EXPECT_EQ(out.hits.item<double>(), hits_ref.item<double>());
    out.weighted_ce.backward();
    auto err = ((h.grad() - h_ref.grad()).norm() / h_ref.grad().norm()).item<double>();
    EXPECT_LE(err, 1e-5);
  }
}

TEST(objective, scored_rows_give_the_all_rows_cross_entropy_and_gradient) {
  // scored_cross_entropy skips each block's position 0 (mask 0); the loss,
  // hits and the hidden gradient must equal the cross-entropy over every row,
  // position 0's gradient must be 0, and row_hits come block by block.
  const int64_t b = 2, s = 48, bs = 4, n = 5, d = 8, v = 30;
  auto g = gen(11);
  auto tokens = at::randint(v, {b, s}, g, at::kLong);
  auto loss_mask = (at::rand({b, s}, g) > 0.2).to(at::kByte);
  auto docs = make_doc_layout(at::tensor({20, 28, 48, 0}, at::kLong).view({b, 2}), s);
  auto a = sample_anchors(loss_mask, docs, n, bs, gen(2));
  auto embed = at::randn({v, d}, g, at::kDouble);
  auto batch = make_block_batch(tokens, loss_mask, docs, at::randn({b, s, d}, g, at::kDouble), a, embed, bs,
                                v - 1, default_gamma(bs));
  ASSERT_GT(batch.mask.sum().item<double>(), 0);
  auto hidden0 = at::randn({b, n * bs, d}, g, at::kDouble);
  objective_options opts;
  opts.block_size = bs;
  opts.chunk_rows = 7;
  auto h_all = hidden0.clone().requires_grad_(true);
  auto all = chunked_cross_entropy(h_all.reshape({-1, d}), embed, batch.labels.reshape({-1}),
                                   batch.loss_weight.reshape({-1}), batch.mask.reshape({-1}), 7);
  all.weighted_ce.backward();
  auto h = hidden0.clone().requires_grad_(true);
  auto scored = scored_cross_entropy(h, embed, batch, opts);
  scored.weighted_ce.backward();
  EXPECT_NEAR(scored.weighted_ce.item<double>(), all.weighted_ce.item<double>(),
              1e-5 * std::abs(all.weighted_ce.item<double>()));
  EXPECT_EQ(scored.hits.item<double>(), all.hits.item<double>());
  EXPECT_EQ(scored.row_hits.numel(), b * n * (bs - 1));
  EXPECT_TRUE(at::equal(scored.row_hits,
                        all.row_hits.view({-1, bs}).narrow(1, 1, bs - 1).reshape({-1})));
  EXPECT_LE(((h.grad() - h_all.grad()).norm() / h_all.grad().norm()).item<double>(), 1e-6);
  EXPECT_EQ(h.grad().view({-1, bs, d}).select(1, 0).abs().max().item<double>(), 0.0);
}

TEST(objective, rows_without_anchors_give_zero_loss_not_nan) {
  // No supervised token: every slot is padding; the loss must be 0, finite,
  // and every gradient finite (padding blocks must not poison anything).
  const int64_t s = 24, d = 16, taps = 2, v = 40, bs = 4;
  auto g = gen(3);
  auto drafter = tiny_drafter(g, 1, bs);
  auto& cfg = drafter.first;
  auto& w = drafter.second;
  auto embed = at::randn({v, d}, g);
  auto tokens = at::randint(v, {2, s}, g, at::kLong);
  auto loss_mask = at::zeros({2, s}, at::kByte);
  auto docs = whole_row_layout(2, s, at::kCPU);
  auto a = sample_anchors(loss_mask, docs, 3, bs, gen(1));
  EXPECT_EQ(a.keep.sum().item<int64_t>(), 0);
  auto batch = make_block_batch(tokens, loss_mask, docs, at::randn({2, s, taps * d}, g), a, embed,
                                bs, cfg.mask_token_id, default_gamma(bs));
  objective_options opts;
  opts.block_size = bs;
  opts.mask_token_id = cfg.mask_token_id;
  auto out = dflash_objective(w, cfg, batch, embed, opts);
  EXPECT_EQ(out.loss.item<double>(), 0.0);
  EXPECT_EQ(out.accuracy.item<double>(), 0.0);
  out.loss.backward();
  for (auto& [name, p] : dflash_parameters(w))
    EXPECT_TRUE(at::isfinite(p->grad()).all().item<bool>()) << name;
}

TEST(objective, the_last_layer_computes_only_the_scored_rows_and_they_are_the_same) {
  // dflash_forward(..., Bs) drops each block's position 0 after the last
  // layer's attention: its rows are exactly the full forward's rows 1 … Bs−1
  // (in float64), and the objective's loss and every weight gradient are
  // those of the full forward.
  const int64_t s = 40, d = 16, taps = 2, v = 40, bs = 4, n = 6;
  auto g = gen(5);
  auto drafter = tiny_drafter(g, 2, bs, at::kDouble);
  auto& cfg = drafter.first;
  auto& w = drafter.second;
  auto embed = at::randn({v, d}, g, at::kDouble);
  auto tokens = at::randint(v, {2, s}, g, at::kLong);
  auto loss_mask = at::ones({2, s}, at::kByte);
  auto docs = make_doc_layout(at::tensor({16, 24, 40, 0}, at::kLong).view({2, 2}), s);
  auto a = sample_anchors(loss_mask, docs, n, bs, gen(4));
  auto batch = make_block_batch(tokens, loss_mask, docs, at::randn({2, s, taps * d}, g, at::kDouble), a, embed,
                                bs, cfg.mask_token_id, default_gamma(bs));
  ASSERT_GT(batch.mask.sum().item<double>(), 0);
  auto full = dflash_forward(w, cfg, batch.inputs);
  auto part = dflash_forward(w, cfg, batch.inputs, bs);
  ASSERT_EQ(part.size(1), n * (bs - 1));
  auto expect = full.reshape({2, n, bs, d}).narrow(2, 1, bs - 1).reshape({2, n * (bs - 1), d});
  EXPECT_LE((part - expect).abs().max().item<double>(), 1e-12);
  EXPECT_THROW(dflash_forward(w, cfg, batch.inputs, 5), c10::Error) << "5 does not divide the block positions";

  objective_options opts;
  opts.block_size = bs;
  opts.chunk_rows = 7;
  auto grads = [&](const at::Tensor& hidden) {
    auto ce = scored_cross_entropy(hidden, embed, batch, opts);
    std::vector<at::Tensor> out{ce.weighted_ce.detach()};
    auto params = dflash_parameters(w);
    std::vector<at::Tensor> ps;
    for (auto& [name, p] : params)
      ps.push_back(*p);
    for (auto& t : torch::autograd::grad({ce.weighted_ce}, ps, {}, /*retain_graph=*/false, false, true))
      out.push_back(t.defined() ? t : at::zeros({0}, at::kDouble));
    return out;
  };
  const auto a_full = grads(full), a_part = grads(part);
  ASSERT_EQ(a_full.size(), a_part.size());
  for (size_t i = 0; i < a_full.size(); ++i)
    EXPECT_LE((a_full[i] - a_part[i]).abs().max().item<double>(), 1e-10 * (1 + a_full[i].abs().max().item<double>()))
      << "tensor " << i << " (0: the loss, then the parameters' gradients)";
}

TEST(objective, fused_linear_residual_is_the_residual_plus_the_linear) {
  // residual + x·Wᵀ in one addmm, with the gradients of the composite for x,
  // W and the residual (float64), and inside a weight_grad_accumulation scope
  // W's gradient written into W.grad() (first write, then accumulated).
  auto g = gen(8);
  auto x = at::randn({2, 5, 6}, g, at::kDouble).requires_grad_(true);
  auto w = at::randn({4, 6}, g, at::kDouble).requires_grad_(true);
  auto r = at::randn({2, 5, 4}, g, at::kDouble).requires_grad_(true);
  auto dy = at::randn({2, 5, 4}, g, at::kDouble);
  auto y = fused_linear_residual(x, w, r);
  auto y_ref = r + at::linear(x, w);
  EXPECT_LE((y - y_ref).abs().max().item<double>(), 1e-12);
  auto gf = torch::autograd::grad({y}, {x, w, r}, {dy});
  auto gr = torch::autograd::grad({y_ref}, {x, w, r}, {dy});
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE((gf[i] - gr[i]).abs().max().item<double>(), 1e-12) << "gradient " << i;
  EXPECT_THROW(fused_linear_residual(x, w, at::zeros({2, 5, 3}, at::kDouble)), c10::Error);
  EXPECT_THROW(fused_linear_residual(x.detach().reshape({5, 2, 6}), w, r), c10::Error)
    << "as many rows, in another order: refused, not paired wrongly";

  // In place: two uses of W in one scope, W.grad() = both contributions.
  w.mutable_grad() = at::full({4, 6}, 7.0, at::kDouble);  // stale: the first write overwrites it
  grad_writes writes;
  at::Tensor loss;
  {
    weight_grad_accumulation scope(writes);
    auto y1 = fused_linear_residual(x, w, r);
    auto y2 = fused_linear_residual(x * 2, w, r);
    loss = (y1 * dy).sum() + (y2 * dy).sum();
  }
  loss.backward();
  const auto expect = 3 * at::matmul(dy.reshape({-1, 4}).t(), x.detach().reshape({-1, 6}));
  EXPECT_LE((w.grad() - expect).abs().max().item<double>(), 1e-10);
  EXPECT_EQ(writes.count(), 1u);
}

TEST(objective, fused_linears_sum_the_input_gradient_and_write_each_weight_gradient) {
  // {x·W₁ᵀ, x·W₂ᵀ, x·W₃ᵀ} with the gradients of three at::linear (float64):
  // outside a scope it is three fused_linear; inside, one node whose dx is
  // summed by addmm and whose weight gradients land in W.grad() — a weight
  // used by two nodes (W₂ here, as the drafter's k and v are on the block
  // and on the context) gets both contributions.
  auto g = gen(9);
  auto x = at::randn({2, 5, 6}, g, at::kDouble).requires_grad_(true);
  auto x2 = at::randn({3, 6}, g, at::kDouble).requires_grad_(true);
  std::vector<at::Tensor> w{at::randn({4, 6}, g, at::kDouble).requires_grad_(true),
                            at::randn({2, 6}, g, at::kDouble).requires_grad_(true),
                            at::randn({3, 6}, g, at::kDouble).requires_grad_(true)};
  std::vector<at::Tensor> dy{at::randn({2, 5, 4}, g, at::kDouble), at::randn({2, 5, 2}, g, at::kDouble),
                             at::randn({2, 5, 3}, g, at::kDouble)};
  auto dy2 = at::randn({3, 2}, g, at::kDouble);
  auto reference = [&] {
    auto loss = (at::linear(x2, w[1]) * dy2).sum();
    for (size_t i = 0; i < 3; ++i)
      loss = loss + (at::linear(x, w[i]) * dy[i]).sum();
    return torch::autograd::grad({loss}, {x, x2, w[0], w[1], w[2]});
  }();
  auto outside = fused_linears(x, w);
  ASSERT_EQ(outside.size(), 3u);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_TRUE(at::equal(outside[i], at::linear(x, w[i]))) << "output " << i;

  for (auto& wi : w)
    wi.mutable_grad() = at::full(wi.sizes(), 7.0, at::kDouble);  // stale: first writes overwrite
  grad_writes writes;
  at::Tensor loss;
  {
    weight_grad_accumulation scope(writes);
    auto ys = fused_linears(x, w);
    auto y2 = fused_linear(x2, w[1]);
    loss = (y2 * dy2).sum();
    for (size_t i = 0; i < 3; ++i)
      loss = loss + (ys[i] * dy[i]).sum();
  }
  auto dx = torch::autograd::grad({loss}, {x, x2});
  EXPECT_LE((dx[0] - reference[0]).abs().max().item<double>(), 1e-10);
  EXPECT_LE((dx[1] - reference[1]).abs().max().item<double>(), 1e-10);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_LE((w[i].grad() - reference[2 + i]).abs().max().item<double>(), 1e-10) << "weight " << i;
  EXPECT_EQ(writes.count(), 3u);
}

TEST(objective, default_gamma_follows_dflash) {
  EXPECT_EQ(default_gamma(16), 7.0);
  EXPECT_EQ(default_gamma(10), 5.0);
  EXPECT_EQ(default_gamma(8), 4.0);
}

TEST(objective, drafter_step_flops_count_the_work_the_step_needs) {
  // Qwen3-8B drafter shapes (D 4096, 32/8 heads of 128, I 12288, V 151936;
  // 5 layers, 5 taps, S 3072, N 512, Bs 16), counted here term by term
  // (docs/bench.md, "FLOP formulas"): 3 × (5 layers' matmuls and attention −
  // the last layer's unscored o/MLP rows) − the first layer's q/k/v on the
  // repeated mask rows (forward and weight gradient over N + 1 distinct rows,
  // no input gradient) + 2 × fc + 2 × lm-head.
  const double d = 4096, hq = 32 * 128, kv = 8 * 128, i = 12288, v = 151936, s = 3072, n = 512, bs = 16, q = n * bs;
  const double layer = 2 * q * (d * hq + hq * d + 3 * d * i) + 2 * (q + s) * 2 * d * kv;
  const double attention = 4 * (n * (s - bs) / 2 * bs + q * bs) * hq;
  const double unscored = 2 * n * (hq * d + 3 * d * i);
  const double qkv_all = 2 * q * d * (hq + 2 * kv), qkv_distinct = 2 * (n + 1) * d * (hq + 2 * kv);
  const double fc = 2 * s * 5 * d * d, head = 2 * n * (bs - 1) * d * v;
  const double want = 3 * (5 * (layer + attention) - unscored) - (3 * qkv_all - 2 * qkv_distinct) + 2 * fc + 2 * head;
  matmul_dims m{d, 32, 8, 128, i, v};
  const double got = expected_drafter_step_flops(m, 5, 5, 1, s, n, bs);
  EXPECT_NEAR(got / want, 1.0, 1e-12);
  EXPECT_NEAR(got / 1e12, 69.746, 0.001) << "docs/bench.md states ≈ 69.7 TFLOP";
  // The first layer's distinct rows: one mask row for the whole batch.
  const double two_rows = expected_drafter_step_flops(m, 5, 5, 2, s, n, bs);
  const double per_row = 2 * d * (hq + 2 * kv);  // one row's q/k/v
  EXPECT_NEAR(2 * got - two_rows, 2 * per_row, 1e3)
    << "two rows share the mask row: twice one row's count has one distinct row more (forward and weight gradient)";
}
