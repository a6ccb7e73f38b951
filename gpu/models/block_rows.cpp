#include "gpu/models/block_rows.hpp"

#include <vector>

#include <ATen/ExpandUtils.h>

#include "gpu/device/error.hpp"

#ifdef TANDEM_HAVE_CUDA
#include "gpu/kernels/block_rows.hpp"
#endif

namespace tandem::gpu {
namespace {

/// t's sizes with dimension 1 (N·Bs) split into [N, Bs].
std::vector<int64_t> split_blocks(at::IntArrayRef sizes, int64_t block_size) {
  std::vector<int64_t> s{sizes[0], sizes[1] / block_size, block_size};
  s.insert(s.end(), sizes.begin() + 2, sizes.end());
  return s;
}

/// t's sizes with N·Bs replaced by N·(Bs − 1).
std::vector<int64_t> kept_sizes(at::IntArrayRef sizes, int64_t block_size) {
  auto s = sizes.vec();
  s[1] = sizes[1] / block_size * (block_size - 1);
  return s;
}

at::Tensor drop_composite(const at::Tensor& t, int64_t bs) {
  return t.reshape(split_blocks(t.sizes(), bs)).narrow(2, 1, bs - 1).reshape(kept_sizes(t.sizes(), bs));
}

/// Bytes of one row (the dimensions after the first `lead`).
int64_t row_bytes(const at::Tensor& t, int64_t lead) {
  int64_t n = 1;
  for (int64_t i = lead; i < t.dim(); ++i)
    n *= t.size(i);
  return n * static_cast<int64_t>(t.element_size());
}

/// Why the kernel does not take t with rows after its first `lead`
/// dimensions ("" when it does).
std::string refusal(const at::Tensor& t, int64_t lead) {
#ifdef TANDEM_HAVE_CUDA
  if (!t.is_cuda())
    return "not on CUDA";
  if (t.dim() <= lead)
    return "no row dimensions";
  if (!t.is_contiguous())
    return "not contiguous";
  if (row_bytes(t, lead) % 16 != 0)
    return "rows of " + std::to_string(row_bytes(t, lead)) + " bytes (not a multiple of 16)";
  if (reinterpret_cast<uintptr_t>(t.data_ptr()) % 16 != 0)
    return "data not 16-byte aligned";
  return "";
#else
  (void)t, (void)lead;
  return "built without CUDA";
#endif
}

#ifdef TANDEM_HAVE_CUDA
void move_rows(kernels::block_rows_op op, int64_t blocks, int64_t bs, const at::Tensor& src, at::Tensor& dst,
               int64_t lead) {
  kernels::block_rows_args a;
  a.op = op;
  a.blocks = blocks;
  a.block_size = bs;
  a.row_bytes = row_bytes(dst, lead);
  a.src = src.data_ptr();
  a.dst = dst.data_ptr();
  if (auto e = kernels::block_rows(a, at::cuda::getCurrentCUDAStream()); e != cudaSuccess)
    throw error(errc::device_failure, std::string("block_rows: ") + cudaGetErrorString(e));
}

/// drop_block_firsts on the kernel path; its backward is undrop_first (zero
/// rows at position 0), or the composite's zero-fill and copy when the
/// incoming gradient is not kernel-shaped.
struct drop_firsts_fn : torch::autograd::Function<drop_firsts_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& t, int64_t bs) {
    ctx->saved_data["bs"] = bs;
    ctx->saved_data["sizes"] = t.sizes().vec();
    auto out = at::empty(kept_sizes(t.sizes(), bs), t.options());
    move_rows(kernels::block_rows_op::drop_first, t.size(0) * (t.size(1) / bs), bs, t, out, 2);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto bs = ctx->saved_data["bs"].toInt();
    const auto sizes = ctx->saved_data["sizes"].toIntVector();
    auto g = grads[0].contiguous();
    if (!refusal(g, 2).empty()) {
      auto gi = at::zeros(sizes, g.options());
      drop_composite(gi, bs).copy_(g);
      return {gi, at::Tensor()};
    }
    auto gi = at::empty(sizes, g.options());
    move_rows(kernels::block_rows_op::undrop_first, sizes[0] * (sizes[1] / bs), bs, g, gi, 2);
    return {gi, at::Tensor()};
  }
};

/// spread_block_rows on the kernel path.
struct spread_fn : torch::autograd::Function<spread_fn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& rows, int64_t b, int64_t n,
                            int64_t bs) {
    ctx->saved_data["shape"] = std::vector<int64_t>{b, n, bs};
    auto out = at::empty({b, n * bs, rows.size(1)}, rows.options());
    move_rows(kernels::block_rows_op::spread, b * n, bs, rows, out, 2);
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto s = ctx->saved_data["shape"].toIntVector();
    const auto b = s[0], n = s[1], bs = s[2];
    const auto& g = grads[0];
    const auto o = g.size(2);
    auto g4 = g.reshape({b, n, bs, o});
    auto gi = at::empty({b * n + 1, o}, g.options());
    gi.narrow(0, 0, b * n).view({b, n, o}).copy_(g4.select(2, 0));
    // The mask row's copies: the sum the expand's backward takes (the same
    // call on the same operand layout: the same bits).
    gi.narrow(0, b * n, 1).view({1, 1, 1, o}).copy_(at::sum_to(g4.narrow(2, 1, bs - 1), at::IntArrayRef(std::vector<int64_t>{1, 1, 1, o})));
    return {gi, at::Tensor(), at::Tensor(), at::Tensor()};
  }
};
#endif

} // namespace

std::string block_rows_path(const at::Tensor& t) {
  const auto why = refusal(t, 2);
  return why.empty() ? "cuda kernel" : "composite: " + why;
}

at::Tensor drop_block_firsts(const at::Tensor& t, int64_t block_size) {
  TORCH_CHECK(block_size >= 2 && t.dim() >= 2 && t.size(1) % block_size == 0, "drop_block_firsts: block size ",
              block_size, " does not divide the ", t.dim() >= 2 ? t.size(1) : 0,
              " block positions (or is below 2)");
#ifdef TANDEM_HAVE_CUDA
  if (refusal(t, 2).empty())
    return drop_firsts_fn::apply(t, block_size);
#endif
  return drop_composite(t, block_size);
}

at::Tensor spread_block_rows(const at::Tensor& rows, int64_t batch, int64_t blocks, int64_t block_size) {
  TORCH_CHECK(rows.dim() == 2 && rows.size(0) == batch * blocks + 1 && block_size >= 2, "spread_block_rows: ",
              rows.sizes(), " are not ", batch, "·", blocks, " + 1 rows (or block size ", block_size, " < 2)");
  const auto o = rows.size(1);
#ifdef TANDEM_HAVE_CUDA
  // rows' trailing dimension is its row: the kernel's "lead" is 1 here.
  if (refusal(rows, 1).empty())
    return spread_fn::apply(rows, batch, blocks, block_size);
#endif
  auto anchors = rows.narrow(0, 0, batch * blocks).view({batch, blocks, 1, o});
  auto masks = rows.narrow(0, batch * blocks, 1).view({1, 1, 1, o}).expand({batch, blocks, block_size - 1, o});
  return at::cat({anchors, masks}, 2).view({batch, blocks * block_size, o});
}

} // namespace tandem::gpu
