// drop_block_firsts and spread_block_rows (gpu/models/block_rows.hpp): on
// CUDA their kernels must give the composites' bits, forward and backward
// (they are copies: at::equal, no tolerance), at the drafter's shapes and at
// small odd ones; operands the kernel refuses take the composite and say so.
// The CUDA cases print "[  SKIPPED ]" without a GPU.
#include <gtest/gtest.h>

#include "gpu/models/block_rows.hpp"
#include "gpu/models/dflash.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::gen;

namespace {

/// The composites, written out here (what the ops replaced).
at::Tensor drop_reference(const at::Tensor& t, int64_t bs) {
  std::vector<int64_t> split{t.size(0), t.size(1) / bs, bs}, kept{t.size(0), t.size(1) / bs * (bs - 1)};
  for (int64_t i = 2; i < t.dim(); ++i) {
    split.push_back(t.size(i));
    kept.push_back(t.size(i));
  }
  return t.reshape(split).narrow(2, 1, bs - 1).reshape(kept);
}

at::Tensor spread_reference(const at::Tensor& rows, int64_t b, int64_t n, int64_t bs) {
  const auto o = rows.size(1);
  auto anchors = rows.narrow(0, 0, b * n).view({b, n, 1, o});
  auto masks = rows.narrow(0, b * n, 1).view({1, 1, 1, o}).expand({b, n, bs - 1, o});
  return at::cat({anchors, masks}, 2).view({b, n * bs, o});
}

void check_drop(std::vector<int64_t> shape, int64_t bs, at::ScalarType dtype, bool kernel) {
  SCOPED_TRACE(::testing::Message() << "shape " << at::IntArrayRef(shape) << " Bs " << bs << " " << dtype);
  auto g = gen(3);
  auto x = at::randn(shape, g).to(at::kCUDA, dtype);
  EXPECT_EQ(block_rows_path(x) == "cuda kernel", kernel) << block_rows_path(x);
  auto xl = x.detach().requires_grad_(true);
  auto y = drop_block_firsts(xl, bs);
  auto xr = x.detach().requires_grad_(true);
  auto yr = drop_reference(xr, bs);
  ASSERT_EQ(y.sizes(), yr.sizes());
  EXPECT_TRUE(at::equal(y, yr));
  auto dy = at::randn(yr.sizes(), g).to(at::kCUDA, dtype);
  y.backward(dy);
  yr.backward(dy);
  EXPECT_TRUE(at::equal(xl.grad(), xr.grad()));
  // Position 0 of every block gets no gradient.
  EXPECT_EQ(xl.grad().reshape({shape[0], shape[1] / bs, bs, -1}).select(2, 0).abs().sum().item<double>(), 0.0);
}

void check_spread(int64_t b, int64_t n, int64_t bs, int64_t o, at::ScalarType dtype, bool kernel) {
  SCOPED_TRACE(::testing::Message() << "B " << b << " N " << n << " Bs " << bs << " o " << o << " " << dtype);
  auto g = gen(4);
  auto rows = at::randn({b * n + 1, o}, g).to(at::kCUDA, dtype);
  EXPECT_EQ(block_rows_path(rows.unsqueeze(0)) == "cuda kernel", kernel);
  auto rl = rows.detach().requires_grad_(true);
  auto y = spread_block_rows(rl, b, n, bs);
  auto rr = rows.detach().requires_grad_(true);
  auto yr = spread_reference(rr, b, n, bs);
  ASSERT_EQ(y.sizes(), yr.sizes());
  EXPECT_TRUE(at::equal(y, yr));
  auto dy = at::randn(yr.sizes(), g).to(at::kCUDA, dtype);
  y.backward(dy);
  yr.backward(dy);
  EXPECT_TRUE(at::equal(rl.grad(), rr.grad()));
}

} // namespace

TEST(block_rows, cuda_drop_block_firsts_is_the_composite_bit_for_bit) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check_drop({1, 512 * 16, 4096}, 16, at::kBFloat16, true);  // the drafter's last layer
  check_drop({2, 6 * 10, 32, 8}, 10, at::kFloat, true);       // rows of several dimensions
  check_drop({3, 5 * 2, 24}, 2, at::kHalf, true);             // Bs 2: one kept position a block
  check_drop({2, 4 * 4, 3}, 4, at::kFloat, false);            // 12-byte rows: the composite
}

TEST(block_rows, cuda_spread_block_rows_is_the_composite_bit_for_bit) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device visible";
  check_spread(1, 512, 16, 4096, at::kBFloat16, true);  // the first layer's q
  check_spread(1, 512, 16, 1024, at::kBFloat16, true);  // its k and v
  check_spread(3, 7, 5, 40, at::kFloat, true);
  check_spread(2, 3, 4, 6, at::kHalf, false);           // 12-byte rows: the composite
}

TEST(block_rows, scored_positions_of_labels_take_the_composite) {
  // [B, N·Bs] rows of one element: no row dimension for the kernel, on any device.
  auto labels = at::arange(2 * 3 * 4, at::kLong).reshape({2, 12});
  auto kept = scored_positions(labels, 4);
  EXPECT_TRUE(at::equal(kept, drop_reference(labels, 4)));
  EXPECT_EQ(block_rows_path(labels).rfind("composite: ", 0), 0u);
}
