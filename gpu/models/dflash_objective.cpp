#include "gpu/models/dflash_objective.hpp"

#include <array>
#include <climits>
#include <cmath>

#include "gpu/device/error.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/ce_grad.hpp"
#endif

namespace tandem::gpu {

anchor_set sample_anchors(const at::Tensor& loss_mask, const doc_layout& docs, int64_t num_anchors,
                          int64_t block_size, at::Generator gen) {
  const auto b = loss_mask.size(0), s = loss_mask.size(1);
  auto idx = at::arange(s, docs.start.options()).unsqueeze(0);
  auto candidate = (loss_mask != 0) & (idx <= s - block_size) & (idx + 1 < docs.end);
  auto count = candidate.sum(1);                                           // [B]
  auto take = at::clamp(count - 1, 0, num_anchors);                        // [B]
  // Uniform keys; non-candidates get 2 so they sort last.
  auto keys = at::empty({b, s}, loss_mask.options().dtype(at::kFloat)).uniform_(0, 1, gen);
  keys = at::where(candidate, keys, 2.0f);
  const auto n = std::min(num_anchors, s);
  auto picked = std::get<1>(at::topk(keys, n, /*dim=*/1, /*largest=*/false, /*sorted=*/true));
  auto slot = at::arange(n, idx.options()).unsqueeze(0);
  auto chosen = at::where(slot < take.unsqueeze(1), picked, s);            // s marks unused
  auto sorted = std::get<0>(at::sort(chosen, 1));
  anchor_set out;
  out.keep = sorted < s;
  out.anchors = at::where(out.keep, sorted, 0);
  if (n < num_anchors) {  // fewer positions than slots: pad with unused slots
    auto pad = at::zeros({b, num_anchors - n}, out.anchors.options());
    out.anchors = at::cat({out.anchors, pad}, 1);
    out.keep = at::cat({out.keep, pad.to(at::kBool)}, 1);
  }
  return out;
}

double default_gamma(int64_t block_size) {
  switch (block_size) {
    case 16: return 7.0;
    case 10: return 5.0;
    case 8: return 4.0;
    default: return std::max(1.0, block_size / 2.0 - 1.0);
  }
}

block_batch make_block_batch(const at::Tensor& tokens, const at::Tensor& loss_mask,
                             const doc_layout& docs, const at::Tensor& target_hidden,
                             const anchor_set& a, const at::Tensor& embedding,
                             int64_t block_size, int64_t mask_token_id, double gamma,
                             bool dense_mask) {
  const auto b = tokens.size(0), s = tokens.size(1), n = a.anchors.size(1);
  const auto q = n * block_size;
  auto lopts = tokens.options().dtype(at::kLong);
  auto k = at::arange(block_size, lopts).view({1, 1, block_size});
  auto anchor = a.anchors.unsqueeze(2);                                     // [B, N, 1]
  auto pos = anchor + k;                                                    // [B, N, Bs]
  auto pos_c = at::clamp_max(pos, s - 1).view({b, q});
  auto anchor_start = docs.start.gather(1, a.anchors).unsqueeze(2);         // [B, N, 1]
  auto anchor_end = docs.end.gather(1, a.anchors).unsqueeze(2);
  auto keep = a.keep.unsqueeze(2);                                          // [B, N, 1]

  block_batch out;
  out.labels = tokens.to(at::kLong).gather(1, pos_c);
  auto in_doc = (pos < anchor_end).view({b, q});
  auto scored = (k > 0).expand({b, n, block_size}).reshape({b, q});
  auto supervised = loss_mask.gather(1, pos_c) != 0;
  auto m = keep.expand({b, n, block_size}).reshape({b, q}) & in_doc & scored & supervised;
  out.mask = m.to(at::kFloat);
  auto decay = at::exp(-(k.to(at::kFloat) - 1.0) / gamma).expand({b, n, block_size});
  out.loss_weight = out.mask * decay.reshape({b, q});

  // Block input: [anchor token, MASK × (Bs − 1)], embedded by the target.
  auto first = tokens.to(at::kLong).gather(1, a.anchors).unsqueeze(2);     // [B, N, 1]
  auto ids = at::where(k == 0, first, mask_token_id).view({b, q});
  out.inputs.block_embeds = at::embedding(embedding, ids);
  out.inputs.anchor_embeds = at::embedding(embedding, first.squeeze(2));    // [B, N, D]
  out.inputs.mask_embed = embedding[mask_token_id];
  out.inputs.target_hidden = target_hidden;
  out.inputs.ctx_positions = docs.position;
  out.inputs.block_positions = ((anchor - anchor_start) + k).view({b, q});

  // Visibility: block j sees context key kv iff doc_start(a_j) <= kv < a_j,
  // and block keys only inside block j; padding blocks (keep = 0) see only
  // their own block, which keeps their softmax finite and their outputs
  // out of every scored row.
  if (dense_mask) {
    auto kv = at::arange(s, lopts).view({1, 1, s});
    auto ctx_visible = (kv < anchor) & (kv >= anchor_start) & keep;         // [B, N, S]
    ctx_visible = ctx_visible.unsqueeze(2).expand({b, n, block_size, s}).reshape({b, q, s});
    auto block_id = at::arange(q, lopts).floor_divide(block_size);
    auto blk_visible = (block_id.unsqueeze(1) == block_id.unsqueeze(0)).unsqueeze(0).expand({b, q, q});
    out.inputs.visible = at::cat({ctx_visible, blk_visible}, 2).unsqueeze(1);  // [B, 1, Q, S+Q]
  }

  // The same context rule as per-block ranges, for dflash_attention (which
  // touches only these keys): [doc_start(a_j), a_j), empty when keep = 0.
  // Unlike `visible`, a padding block sees nothing there (its rows are 0).
  auto lo = anchor_start.squeeze(2);                                        // [B, N]
  out.inputs.ctx_lo = lo.to(at::kInt);
  out.inputs.ctx_hi = at::where(a.keep, a.anchors, lo).to(at::kInt);
  out.inputs.keep = a.keep.to(at::kBool);
  return out;
}

namespace {

/// Forward: per chunk, logits = h·headᵀ in float32, lse, CE and hits, and,
/// when hidden needs a gradient, that gradient for an upstream gradient of 1
/// while the chunk's logits are at hand: d(Σ w·CE)/dh = (softmax − onehot)·w
/// · head.  The loss is linear in this sum, so backward only scales the
/// stored [rows, D] gradient by the upstream scalar: the N·Bs·V logits are
/// computed once per step instead of twice (no recompute).
///
/// On CUDA in bf16/fp16 the elementwise part is one kernel
/// (gpu/kernels/ce_grad.hpp): it reads each chunk's logits in their dtype
/// (the matmul's rounding, as the composite's .to(kFloat) sees them),
/// computes in fp32 and writes the logits' gradient over them, so dh is a
/// second matmul straight from that buffer (≈10× less time than the
/// composite's eight passes over [chunk, V] in fp32).  Loss and hits come out
/// per row and are summed once (deterministic, no atomics).  Everything else
/// (CPU, fp32, float64) takes the composite, bit for bit as before.
class chunked_ce_fn : public torch::autograd::Function<chunked_ce_fn> {
public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx,
                                                const at::Tensor& hidden, const at::Tensor& head,
                                                const at::Tensor& labels, const at::Tensor& weight,
                                                const at::Tensor& mask, int64_t chunk_rows,
                                                bool want_grad) {
    // want_grad comes from the caller: needs_input_grad() throws when no
    // input requires a gradient (the node then has no edges).
#ifdef TANDEM_HAVE_CUDA
    if (kernel_takes(hidden, head)) {
      auto out = forward_kernel(hidden, head, labels, weight, mask, chunk_rows, want_grad);
      if (want_grad)
        ctx->save_for_backward({out[2]});
      ctx->mark_non_differentiable({out[1]});
      return {out[0], out[1]};  // per-row hits
    }
#endif
    const auto rows = hidden.size(0);
    auto total = at::zeros({}, hidden.options().dtype(at::kFloat));
    auto row_hits = at::empty({rows}, hidden.options().dtype(at::kFloat));
    auto grad_hidden = want_grad ? at::empty_like(hidden) : at::Tensor();
    for (int64_t r = 0; r < rows; r += chunk_rows) {
      const auto len = std::min(chunk_rows, rows - r);
      auto logits = at::matmul(hidden.narrow(0, r, len), head.t()).to(at::kFloat);  // [len, V]
      auto y = labels.narrow(0, r, len);
      auto w = weight.narrow(0, r, len);
      auto l = at::logsumexp(logits, 1);
      auto picked = logits.gather(1, y.unsqueeze(1)).squeeze(1);
      total += ((l - picked) * w).sum();
      row_hits.narrow(0, r, len).copy_((logits.argmax(1) == y).to(at::kFloat) * mask.narrow(0, r, len));
      if (want_grad) {
        // In place: logits → softmax − onehot(label), scaled by the weight.
        logits.sub_(l.unsqueeze(1)).exp_();
        logits.scatter_add_(1, y.unsqueeze(1), at::full({len, 1}, -1.0f, logits.options()));
        logits.mul_(w.to(at::kFloat).unsqueeze(1));
        grad_hidden.narrow(0, r, len).copy_(at::matmul(logits.to(head.scalar_type()), head));
      }
    }
    if (want_grad)
      ctx->save_for_backward({grad_hidden});
    ctx->mark_non_differentiable({row_hits});
    return {total, row_hits};
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    auto saved = ctx->get_saved_variables();
    // In float32: the upstream scalar (1 / Σw) would lose bits as bfloat16.
    at::Tensor grad_hidden;
#ifdef TANDEM_HAVE_CUDA
    if (saved[0].is_cuda() && saved[0].is_contiguous() && grads[0].numel() == 1
        && (saved[0].scalar_type() == at::kBFloat16 || saved[0].scalar_type() == at::kHalf))
      grad_hidden = scale_kernel(saved[0], grads[0]);
    else
#endif
      grad_hidden = (saved[0].to(at::kFloat) * grads[0].to(at::kFloat)).to(saved[0].scalar_type());
    return {grad_hidden, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(),
            at::Tensor()};
  }

private:
#ifdef TANDEM_HAVE_CUDA
  /// Whether the fused kernel takes these operands: CUDA, hidden [rows, D]
  /// and head [V, D] both bf16 or both fp16 on one device.
  static bool kernel_takes(const at::Tensor& hidden, const at::Tensor& head) {
    const auto t = hidden.scalar_type();
    return hidden.is_cuda() && (t == at::kBFloat16 || t == at::kHalf)
           && head.scalar_type() == t && head.device() == hidden.device() && hidden.dim() == 2
           && head.dim() == 2 && head.size(1) == hidden.size(1) && head.size(0) > 0
           && head.size(0) <= INT_MAX / 2;
  }

  /// The composite's (g.to(float) · s).to(g's dtype) in one pass
  /// (kernels::ce_scale): the same bits.
  static at::Tensor scale_kernel(const at::Tensor& g, const at::Tensor& upstream) {
    c10::cuda::CUDAGuard guard(g.device());
    auto s = upstream.to(g.device(), at::kFloat).reshape({1}).contiguous();
    auto out = at::empty_like(g, at::MemoryFormat::Contiguous);
    kernels::ce_scale_args a;
    a.n = g.numel();
    a.dtype = g.scalar_type() == at::kHalf ? kernels::ce_dtype::fp16 : kernels::ce_dtype::bf16;
    a.src = g.data_ptr();
    a.dst = out.data_ptr();
    a.scale = s.data_ptr<float>();
    if (auto e = kernels::ce_scale(a, at::cuda::getCurrentCUDAStream()); e != cudaSuccess)
      throw error(errc::device_failure, std::string("ce_scale: ") + cudaGetErrorString(e));
    return out;
  }

  /// {Σ w·CE, m·hit per row, dh (for an upstream gradient of 1) or undefined}.
  /// Graph-capturable: allocations on the current stream, no host sync.
  static std::array<at::Tensor, 3> forward_kernel(const at::Tensor& hidden, const at::Tensor& head,
                                                  const at::Tensor& labels,
                                                  const at::Tensor& weight,
                                                  const at::Tensor& mask, int64_t chunk_rows,
                                                  bool want_grad) {
    c10::cuda::CUDAGuard guard(hidden.device());
    const auto rows = hidden.size(0), vocab = head.size(0);
    auto fopts = hidden.options().dtype(at::kFloat);
    auto y = labels.to(hidden.device(), at::kLong).contiguous();
    auto w = weight.to(hidden.device(), at::kFloat).contiguous();
    auto m = mask.to(hidden.device(), at::kFloat).contiguous();
    auto per_row = at::empty({2, rows}, fopts);  // [loss; hit] per row
    auto grad_hidden = want_grad ? at::empty({rows, hidden.size(1)}, hidden.options())
                                 : at::Tensor();
    auto head_t = head.t();
    for (int64_t r = 0; r < rows; r += chunk_rows) {
      const auto len = std::min(chunk_rows, rows - r);
      auto logits = at::matmul(hidden.narrow(0, r, len), head_t);  // [len, V] bf16/fp16
      TORCH_INTERNAL_ASSERT(logits.dim() == 2 && logits.size(1) == vocab && logits.stride(1) == 1);
      kernels::ce_grad_args a;
      a.rows = len;
      a.vocab = vocab;
      a.row_stride = logits.stride(0);
      a.dtype = hidden.scalar_type() == at::kHalf ? kernels::ce_dtype::fp16
                                                  : kernels::ce_dtype::bf16;
      a.logits = logits.data_ptr();
      a.labels = y.data_ptr<int64_t>() + r;
      a.weight = w.data_ptr<float>() + r;
      a.mask = m.data_ptr<float>() + r;
      a.row_loss = per_row.data_ptr<float>() + r;
      a.row_hit = per_row.data_ptr<float>() + rows + r;
      a.write_grad = want_grad;
      if (auto e = kernels::ce_grad(a, at::cuda::getCurrentCUDAStream()); e != cudaSuccess)
        throw error(errc::device_failure, std::string("ce_grad: ") + cudaGetErrorString(e));
      if (want_grad) {  // logits now hold (softmax − onehot)·w in their dtype
        auto dst = grad_hidden.narrow(0, r, len);  // contiguous rows: mm writes in place
        at::mm_out(dst, logits, head);
      }
    }
    // Fixed reduction order for a given size: bit-reproducible.
    return {per_row[0].sum(), per_row[1], grad_hidden};
  }
#endif
};

} // namespace

chunked_ce_result chunked_cross_entropy(const at::Tensor& hidden, const at::Tensor& head,
                                        const at::Tensor& labels, const at::Tensor& weight,
                                        const at::Tensor& mask, int64_t chunk_rows) {
  const bool want_grad = hidden.requires_grad() && at::GradMode::is_enabled();
  auto out = chunked_ce_fn::apply(hidden, head.detach(), labels, weight.detach(), mask.detach(),
                                  chunk_rows, want_grad);
  return {out[0], out[1].sum(), out[1]};
}

chunked_ce_result scored_cross_entropy(const at::Tensor& hidden, const at::Tensor& head,
                                       const block_batch& batch, const objective_options& opts) {
  const auto bs = opts.block_size;
  const auto d = hidden.size(-1);
  const auto q_len = batch.labels.size(-1);
  const bool all_rows = hidden.dim() == 3 && hidden.size(1) == q_len;
  TORCH_CHECK(bs >= 2 && q_len % bs == 0 && hidden.dim() == 3
                && (all_rows || hidden.size(1) == q_len / bs * (bs - 1)),
              "scored_cross_entropy: hidden ", hidden.sizes(), " holds neither the ", q_len,
              " block positions nor their scored ones (block size ", bs, ")");
  // Position 0 of every block is the anchor's own token: never scored (its
  // mask is 0), so its rows skip the lm-head, which is ~1/Bs of the step's
  // two largest GEMMs.  Rows go block by block, positions 1 … Bs−1.
  auto scored_rows = [bs](const at::Tensor& t) { return scored_positions(t, bs).reshape({-1}); };
  return chunked_cross_entropy((all_rows ? scored_positions(hidden, bs) : hidden).reshape({-1, d}), head,
                               scored_rows(batch.labels), scored_rows(batch.loss_weight),
                               scored_rows(batch.mask), opts.chunk_rows);
}

objective_output dflash_objective(const dflash_weights& w, const dflash_config& cfg,
                                  const block_batch& batch, const at::Tensor& lm_head,
                                  const objective_options& opts) {
  // On CUDA [B, N·(Bs−1), D]: the last layer skips position 0 of every
  // block.  The CPU keeps [B, N·Bs, D] (its results stay bit for bit what
  // they were; scored_cross_entropy drops position 0 then).
  const bool cuda = batch.inputs.block_embeds.is_cuda();
  auto hidden = dflash_forward(w, cfg, batch.inputs, cuda ? opts.block_size : 0);
  auto ce = scored_cross_entropy(hidden, lm_head, batch, opts);
  const auto bs = opts.block_size;
  objective_output out;
  out.scored = batch.mask.sum();
  out.loss = ce.weighted_ce / (batch.loss_weight.sum() + 1e-6);
  out.accuracy = ce.hits / at::clamp_min(out.scored, 1.0);
  // Simulated acceptance: blocks [B, N, Bs]; positions 1 … Bs−1 are scored.
  auto hit = ce.row_hits.view({-1, bs - 1});                                 // [B·N, Bs−1]
  auto run = hit.cumprod(1).sum(1);                                          // leading hits
  auto scored_block = (batch.mask.reshape({-1, bs}).narrow(1, 1, bs - 1).sum(1) > 0).to(at::kFloat);
  out.sim_accept = ((1.0 + run) * scored_block).sum() / at::clamp_min(scored_block.sum(), 1.0);
  return out;
}

} // namespace tandem::gpu
