// The target's packed forward (gpu/models/qwen3_packed.cpp, issue 20) on a
// random bf16 Qwen3 with packed documents, against independent references:
// - the same weights in fp32 through the dense-mask path (composite norms
//   and RoPE, SDPA over a [B, 1, S, S] document mask) — within bf16's error,
//   and no further from it than the bf16 mask path it replaces;
// - lengths past a row's end cut as the mask path cuts them;
// - documents isolated: changing one document's tokens changes no other
//   document's taps, bit for bit;
// - graphs replay the eager packed forward bit for bit, for new inputs too;
// - the two kernels against the composites they fuse (gpu/kernels/
//   target_fused.cu): SwiGLU bit for bit, q/k norm + RoPE within one bf16
//   rounding on a handful of elements (only the sum-of-squares order differs);
// - the chunked attention (head_dim 128, GQA 4 on an H100/H200) against an
//   fp32 per-document causal reference and FlashAttention-2 varlen, at
//   documents of every length (1, 15, 16, 17, empty, a row's padding).

#include <cmath>
#include <cstdio>
#include <limits>

#include <gtest/gtest.h>

#include "gpu/engine/target_forward.hpp"
#include "gpu/kernels/target_fused.hpp"
#include "gpu/models/common.hpp"
#include "gpu/models/dflash_attention.hpp"
#include "gpu/models/fused_ops.hpp"
#include "gpu/models/qwen3.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::gen;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::rel_err;

namespace {

qwen3_config small_config(int64_t head_dim, int64_t heads = 4, int64_t kv_heads = 2) {
  qwen3_config c;
  c.vocab_size = 512;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_hidden_layers = 6;  // 4 loaded: the taps stop at layer 3
  c.num_attention_heads = heads;
  c.num_key_value_heads = kv_heads;
  c.head_dim = head_dim;
  c.max_position_embeddings = 4096;
  c.rms_norm_eps = 1e-6;
  c.rope_theta = 1e6;
  return c;
}

/// Random weights in fp32 on cuda:0 (norm weights away from 1, so a norm
/// that skipped its weight would show).
qwen3_weights random_weights(const qwen3_config& c, uint64_t seed) {
  auto g = gen(seed);
  const at::Device dev(at::kCUDA, 0);
  layer_dims d{c.hidden_size, c.intermediate_size, c.num_attention_heads, c.num_key_value_heads,
               c.head_dim, c.rms_norm_eps};
  qwen3_weights w;
  w.embed = at::randn({c.vocab_size, c.hidden_size}, g).to(dev);
  w.lm_head = w.embed;
  for (int i = 0; i < 4; ++i) {
    auto l = random_decoder_layer(d, at::kFloat, at::kCPU, g, 0.06);
    for (auto* p : layer_tensors(l)) {
      if (p->dim() == 1)
        *p = 1.0 + 0.3 * at::randn(p->sizes(), g);
      *p = p->to(dev);
    }
    w.layers.push_back(l);
  }
  return w;
}

qwen3_weights to_dtype(const qwen3_weights& w, at::ScalarType t) {
  qwen3_weights o;
  o.embed = w.embed.to(t);
  o.lm_head = o.embed;
  for (auto l : w.layers) {
    for (auto* p : layer_tensors(l))
      *p = p->to(t);
    o.layers.push_back(l);
  }
  return o;
}

} // namespace

TEST(target_packed, matches_the_fp32_mask_path_and_keeps_documents_apart) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  // head_dim 16 and 64 (GQA 2) take FlashAttention-2; 128 with GQA 4 the
  // chunked DFlash kernel on sm_90.
  for (auto [head_dim, heads] : {std::pair<int64_t, int64_t>{16, 4}, {64, 4}, {128, 8}}) {
    SCOPED_TRACE("head_dim " + std::to_string(head_dim));
    const auto c = small_config(head_dim, heads, 2);
    const auto w = random_weights(c, 5 + head_dim);
    const std::vector<int64_t> taps{0, 2, 3};
    qwen3_target ref(c, w, taps);  // fp32: the mask path
    qwen3_target ours(c, to_dtype(w, at::kBFloat16), taps);
    ASSERT_EQ(ours.packed_path(), "packed");
    EXPECT_NE(ref.packed_path(), "packed");
    const bool hopper = at::cuda::getDeviceProperties(0)->major == 9;
    std::printf("head_dim %lld: attention %s\n", static_cast<long long>(head_dim), ours.packed_attention().c_str());
    EXPECT_EQ(ours.packed_attention() == "dflash chunked", head_dim == 128 && hopper) << ours.packed_attention();
    ASSERT_TRUE(ours.weights().layers[0].qkv_proj.defined());
    EXPECT_EQ(ours.weights().layers[0].k_proj.data_ptr(),
              static_cast<char*>(ours.weights().layers[0].qkv_proj.data_ptr())
                + c.num_attention_heads * c.head_dim * c.hidden_size * 2);

    const at::Device dev(at::kCUDA, 0);
    const int64_t s = 256;
    auto g = gen(11);
    auto ids = at::randint(c.vocab_size, {3, s}, g, at::kLong).to(dev);
    // Row 0: two documents and what they leave (a third); row 1: one
    // document filling it; row 2: empty entries between documents.
    auto lengths = at::tensor({100, 50, 0, 0, 256, 0, 0, 0, 10, 0, 30, 200}, at::kLong).view({3, 4}).to(dev);

    const auto want = ref.forward(ids, make_doc_layout(lengths, s)).taps;
    target_forward_runner eager(ours, dev, "eager"), graphs(ours, dev, "graphs"), mask(ours, dev, "mask");
    EXPECT_EQ(eager.path(), "packed");
    EXPECT_EQ(graphs.path(), "packed (graphs)");
    const auto got = eager.taps(ids, lengths);
    const auto old = mask.taps(ids, lengths);
    ASSERT_EQ(got.sizes(), want.sizes());
    const double err = rel_err(got, want), err_old = rel_err(old, want);
    std::printf("head_dim %lld: packed bf16 vs fp32 rel err %.3e; mask bf16 %.3e\n",
                static_cast<long long>(head_dim), err, err_old);
    EXPECT_LT(err, 1.5e-2);
    EXPECT_LT(err, 1.5 * err_old + 1e-3);

    // Lengths past S (and a negative one) are cut as make_doc_layout cuts
    // them: the same documents as the mask path, nothing read past a row.
    auto over = at::tensor({200, 100, 0, 0, -5, 256, 7, 0, 250, 250, 0, 0}, at::kLong).view({3, 4}).to(dev);
    const auto want_over = ref.forward(ids, make_doc_layout(over, s)).taps;
    EXPECT_LT(rel_err(eager.taps(ids, over), want_over), 1.5e-2);

    // Graphs: bit for bit the eager packed forward, and again for new inputs
    // (a stale static buffer would replay the first batch).
    EXPECT_TRUE(at::equal(graphs.taps(ids, lengths), got));
    auto ids2 = ids.clone();
    ids2.select(0, 0).narrow(0, 100, 50).random_(0, c.vocab_size);  // row 0's second document
    auto lengths2 = at::tensor({60, 90, 0, 0, 256, 0, 0, 0, 10, 0, 30, 200}, at::kLong).view({3, 4}).to(dev);
    const auto got2 = eager.taps(ids2, lengths2);
    EXPECT_TRUE(at::equal(graphs.taps(ids2, lengths2), got2));
    EXPECT_EQ(graphs.replays(), 2);

    // Isolation: only row 0's second document changed; every other
    // document's taps are bit-identical.
    const auto changed = eager.taps(ids2, lengths);
    EXPECT_TRUE(at::equal(changed.select(0, 0).narrow(0, 0, 100), got.select(0, 0).narrow(0, 0, 100)));
    EXPECT_TRUE(at::equal(changed.select(0, 0).narrow(0, 150, s - 150), got.select(0, 0).narrow(0, 150, s - 150)));
    EXPECT_TRUE(at::equal(changed.narrow(0, 1, 2), got.narrow(0, 1, 2)));
    EXPECT_FALSE(at::equal(changed.select(0, 0).narrow(0, 100, 50), got.select(0, 0).narrow(0, 100, 50)));
  }
}

TEST(target_packed, kernels_match_the_composites) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const at::Device dev(at::kCUDA, 0);
  auto g = gen(3);
  auto bf = at::TensorOptions().dtype(at::kBFloat16).device(dev);
  // SwiGLU rows: bit for bit fused_swiglu of the two halves; a chunk count
  // past one CTA's 256 (I = 4104), and more tokens than a grid's y (the
  // grid-stride form).
  for (auto [t, inter] : {std::pair<int64_t, int64_t>{37, 136}, {5, 4104}, {70000, 8}}) {
    SCOPED_TRACE("tokens " + std::to_string(t) + ", inter " + std::to_string(inter));
    auto gu = at::randn({t, 2 * inter}, g).mul(3).to(bf);
    auto out = at::empty({t, inter}, bf);
    kernels::swiglu_rows_args a;
    a.tokens = t;
    a.inter = inter;
    a.gu = gu.data_ptr();
    a.out = out.data_ptr();
    ASSERT_EQ(kernels::swiglu_rows(a, at::cuda::getCurrentCUDAStream()), cudaSuccess);
    EXPECT_TRUE(at::equal(out, fused_swiglu(gu.narrow(1, 0, inter), gu.narrow(1, inter, inter))));
  }
  // q/k norm + RoPE in place on a fused qkv: the composites on q and k, v untouched.
  for (int64_t h : {16, 32, 64, 128, 256}) {
    SCOPED_TRACE("head_dim " + std::to_string(h));
    const int64_t t = 45, nh = 4, nk = 2, width = (nh + 2 * nk) * h;
    auto qkv = at::randn({t, width}, g).mul(2).to(bf);
    auto qn = (1.0 + 0.3 * at::randn({h}, g)).to(bf), kn = (1.0 + 0.3 * at::randn({h}, g)).to(bf);
    auto pos = at::randint(0, 3000, {t}, g, at::kLong).to(dev);
    auto [cos, sin] = rope_tables(pos, h, 1e6);
    auto before = qkv.clone();
    kernels::qk_norm_rope_args a;
    a.tokens = t;
    a.heads = nh;
    a.kv_heads = nk;
    a.head_dim = static_cast<int>(h);
    a.row_stride = width;
    a.qkv = qkv.data_ptr();
    a.q_norm = qn.data_ptr();
    a.k_norm = kn.data_ptr();
    a.cos = cos.data_ptr<float>();
    a.sin = sin.data_ptr<float>();
    ASSERT_EQ(kernels::qk_norm_rope(a, at::cuda::getCurrentCUDAStream()), cudaSuccess);
    auto expect = [&](int64_t first, int64_t heads, const at::Tensor& w) {
      auto x = before.narrow(1, first * h, heads * h).reshape({1, t, heads, h});
      auto n = rms_norm_composite(x, w, 1e-6).transpose(1, 2);               // [1, heads, T, h]
      return apply_rope_composite(n, cos.unsqueeze(0), sin.unsqueeze(0)).transpose(1, 2).reshape({t, heads * h});
    };
    for (auto [first, heads, w] : {std::tuple{int64_t{0}, nh, qn}, std::tuple{nh, nk, kn}}) {
      auto got = qkv.narrow(1, first * h, heads * h).to(at::kFloat);
      auto want = expect(first, heads, w).to(at::kFloat);
      const auto differ = (got != want).sum().item<int64_t>();
      const auto worst = (got - want).abs().max().item<double>();
      EXPECT_LE(differ, got.numel() / 100) << differ << " of " << got.numel() << " differ";
      EXPECT_LT(worst, 0.07);  // a bf16 rounding or two (|x| < 8) where the sum order tipped one
    }
    EXPECT_TRUE(at::equal(qkv.narrow(1, (nh + nk) * h, nk * h), before.narrow(1, (nh + nk) * h, nk * h)));
  }
}

TEST(target_packed, chunked_attention_matches_fp32_and_flash2) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const at::Device dev(at::kCUDA, 0);
  auto bf = at::TensorOptions().dtype(at::kBFloat16).device(dev);
  const int64_t h = 8, kvh = 2, d = 128;
  const auto why = causal_chunked_unsupported(bf, h, kvh, d);
  if (!why.empty())
    GTEST_SKIP() << "SKIPPED: the chunked kernel does not run here (" << why << ")";
  auto g = gen(21);
  // Rows of S = 200 (not a multiple of 16); each row's documents, the last
  // entry being what the others leave (the engine passes it the same way).
  const int64_t s = 200;
  const std::vector<std::vector<int64_t>> rows{{1, 15, 16, 17, 0, 151}, {200, 0, 0, 0, 0, 0},
                                               {33, 0, 47, 64, 56, 0}, {3, 5, 7, 9, 11, 165}};
  const int64_t b = static_cast<int64_t>(rows.size()), docs = 6;
  std::vector<int64_t> flat;
  for (const auto& r : rows)
    flat.insert(flat.end(), r.begin(), r.end());
  auto lengths = at::tensor(flat, at::kLong).view({b, docs}).to(dev);
  auto ends = lengths.cumsum(1);
  auto starts = ends - lengths;
  const auto chunks = causal_chunks_of(starts, lengths, s);
  ASSERT_EQ(chunks.row0.size(1), (s + 15) / 16 + docs);
  // Every token in exactly one live chunk.
  auto covered = at::zeros({b, s}, at::kInt);
  const auto row0 = chunks.row0.cpu(), n = chunks.rows.cpu(), keep = chunks.keep.cpu();
  for (int64_t r = 0; r < b; ++r)
    for (int64_t j = 0; j < row0.size(1); ++j)
      if (keep[r][j].item<bool>())
        covered[r].narrow(0, row0[r][j].item<int>(), n[r][j].item<int>()) += 1;
  EXPECT_TRUE(at::equal(covered, at::ones({b, s}, at::kInt)));

  auto qkv = at::randn({b * s, (h + 2 * kvh) * d}, g).to(bf);
  auto q = qkv.narrow(1, 0, h * d).unflatten(1, {h, d});
  auto k = qkv.narrow(1, h * d, kvh * d).unflatten(1, {kvh, d});
  auto v = qkv.narrow(1, (h + kvh) * d, kvh * d).unflatten(1, {kvh, d});
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto got = causal_chunked_attention(q, k, v, chunks, s, scale);
  ASSERT_EQ(got.sizes(), q.sizes());

  // fp32 reference, document by document.
  auto want = at::zeros({b * s, h, d}, at::TensorOptions().dtype(at::kFloat).device(dev));
  for (int64_t r = 0; r < b; ++r) {
    int64_t at0 = r * s;
    for (int64_t len : rows[r]) {
      if (len == 0)
        continue;
      auto qq = q.narrow(0, at0, len).to(at::kFloat).transpose(0, 1);                       // [h, L, d]
      auto kk = k.narrow(0, at0, len).to(at::kFloat).transpose(0, 1).repeat_interleave(h / kvh, 0);
      auto vv = v.narrow(0, at0, len).to(at::kFloat).transpose(0, 1).repeat_interleave(h / kvh, 0);
      auto sc = at::matmul(qq, kk.transpose(1, 2)) * scale;
      auto mask = at::ones({len, len}, at::TensorOptions().dtype(at::kBool).device(dev)).tril();
      sc = sc.masked_fill(mask.logical_not(), -std::numeric_limits<double>::infinity());
      want.narrow(0, at0, len).copy_(at::matmul(sc.softmax(-1), vv).transpose(0, 1));
      at0 += len;
    }
  }
  auto cu = at::cat({at::zeros({1}, lengths.options()),
                     (ends + at::arange(b, lengths.options()).unsqueeze(1) * s).flatten()}).to(at::kInt);
  const auto fa2 = std::get<0>(at::_flash_attention_forward(q, k, v, cu, cu, s, s, 0.0, true, false, scale));
  const double err = rel_err(got, want), err_fa2 = rel_err(fa2, want);
  std::printf("chunked attention vs fp32: rel err %.3e (FlashAttention-2 varlen %.3e)\n", err, err_fa2);
  EXPECT_LT(err, 1e-2);
  EXPECT_LT(err, 1.5 * err_fa2 + 1e-3);
  EXPECT_FALSE(got.isnan().any().item<bool>());
}

// The chunk table (plain tensor operations, so the CPU checks it): every
// token of every row in exactly one live chunk of at most 16 rows, inside
// its document, whose context is the document's rows before the chunk.
TEST(target_packed, chunk_table_covers_each_token_once) {
  auto g = gen(4);
  for (int trial = 0; trial < 20; ++trial) {
    const int64_t s = 1 + at::randint(300, {1}, g, at::kLong).item<int64_t>();
    const int64_t b = 1 + trial % 3, docs = 1 + trial % 6;
    // Random cuts of each row into `docs` documents (empty ones allowed).
    auto cuts = std::get<0>(at::randint(s + 1, {b, docs - 1}, g, at::kLong).sort(1));
    auto bounds = at::cat({at::zeros({b, 1}, at::kLong), cuts, at::full({b, 1}, s, at::kLong)}, 1);
    auto starts = bounds.narrow(1, 0, docs), lengths = bounds.narrow(1, 1, docs) - starts;
    const auto c = causal_chunks_of(starts.contiguous(), lengths.contiguous(), s);
    ASSERT_EQ(c.row0.sizes(), at::IntArrayRef({b, (s + 15) / 16 + docs}));
    for (int64_t r = 0; r < b; ++r) {
      std::vector<int> seen(static_cast<size_t>(s), 0);
      for (int64_t j = 0; j < c.row0.size(1); ++j) {
        const int row0 = c.row0[r][j].item<int>(), n = c.rows[r][j].item<int>();
        const int lo = c.lo[r][j].item<int>(), hi = c.hi[r][j].item<int>();
        if (!c.keep[r][j].item<bool>()) {
          EXPECT_EQ(n, 0);
          continue;
        }
        ASSERT_GE(n, 1);
        ASSERT_LE(n, 16);
        EXPECT_EQ(hi, row0);
        // lo is the start of the document holding the chunk, which ends past it.
        bool inside = false;
        for (int64_t d = 0; d < docs; ++d)
          inside |= starts[r][d].item<int64_t>() == lo && lo + lengths[r][d].item<int64_t>() >= row0 + n
                    && lengths[r][d].item<int64_t>() > 0;
        EXPECT_TRUE(inside) << "row " << r << " chunk " << j;
        for (int i = row0; i < row0 + n; ++i)
          ++seen[static_cast<size_t>(i)];
      }
      for (int64_t i = 0; i < s; ++i)
        ASSERT_EQ(seen[static_cast<size_t>(i)], 1) << "s " << s << " row " << r << " token " << i;
    }
  }
}
