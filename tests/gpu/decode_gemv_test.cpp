// The decode GEMV kernel (gpu/kernels/decode_gemv.hpp, through
// gpu::decode_linear) against an independent reference from the same
// inputs: x̂ by the RMSNorm composite (rms_norm_composite, the CPU path's
// code), then x̂ · Wᵀ (+ residual) in float64 on the CPU.  bf16 and fp16;
// 1 to 4 rows; with and without the fused norm or SwiGLU (x = [gate | up],
// x̂ = T(silu(gate) · up) in fp32 from the same inputs) and the residual; an odd
// number of outputs (the last row pair holds one row) and k = 8 · odd
// (the unrolled loop's remainder); x with a row stride longer than its row.
// Tolerance: the output's own rounding, half an ulp (at most 2⁻⁸ relative
// for bf16, 2⁻¹¹ for fp16), plus the fp32 sum's error, bounded by 4e-6 · Σ|x̂·w|;
// an x̂ element the kernel rounds one ulp away from the composite (the sum
// of squares' order, rsqrtf) adds at most an ulp of one term.  Then the
// limits: five rows, k not a multiple of 8 and a misaligned x fall back
// (an undefined tensor), and cuBLAS's addmm on the same operands is no
// closer to the reference than the kernel.  CUDA cases print "[  SKIPPED ]"
// without a GPU.
#include <cstdio>
#include <vector>

#include <gtest/gtest.h>

#include "gpu/models/fused_ops.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;

namespace {

struct gemv_case {
  int64_t m, n, k;
  bool norm, residual;
  at::ScalarType dtype;
  bool swiglu = false;  ///< x is [m, 2k], gate then up; x̂ = T(silu(gate) · up)
};

struct gemv_result {
  double worst = 0;     ///< max over outputs of |ours − ref| / bound
  double cublas = 0;    ///< the same for cuBLAS
  bool ran = false;
};

gemv_result run_case(const gemv_case& c, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto randn = [&](std::vector<int64_t> shape, double scale) {
    return (at::randn(shape, g, at::TensorOptions().dtype(at::kFloat)) * scale).to(c.dtype);
  };
  // x with a row stride of its width + 8: a view of a wider buffer.
  const int64_t width = c.swiglu ? 2 * c.k : c.k;
  const auto xbuf = randn({c.m, width + 8}, 1.0);
  const auto x_cpu = xbuf.narrow(1, 0, width);
  const auto w_cpu = randn({c.n, c.k}, 0.05);
  const auto nw_cpu = c.norm ? (randn({c.k}, 0.1) + 1.0).to(c.dtype) : at::Tensor();
  const auto r_cpu = c.residual ? randn({c.m, c.n}, 2.0) : at::Tensor();

  // The reference: x̂ by the composite (same rounding), the product in float64.
  auto swiglu_ref = [&](const at::Tensor& gu) {  // fp32 math, one rounding, as swiglu_rows
    const auto g = gu.narrow(1, 0, c.k).to(at::kFloat), u = gu.narrow(1, c.k, c.k).to(at::kFloat);
    return (g / (1 + at::exp(-g)) * u).to(c.dtype);
  };
  const auto xhat = c.norm     ? rms_norm_composite(x_cpu, nw_cpu, 1e-6)  // in T, as rms_norm rounds
                    : c.swiglu ? swiglu_ref(x_cpu)
                               : x_cpu;
  auto prod = xhat.to(at::kDouble).matmul(w_cpu.to(at::kDouble).t());
  const auto mag = xhat.to(at::kDouble).abs().matmul(w_cpu.to(at::kDouble).abs().t());
  if (c.residual)
    prod = prod + r_cpu.to(at::kDouble);
  // Half an ulp of the output, relative: up to 2⁻⁸ (bf16) or 2⁻¹¹ (fp16)
  // just above a power of two.
  const double half_ulp = c.dtype == at::kBFloat16 ? 1.0 / 256 : 1.0 / 2048;
  const auto bound = prod.abs() * half_ulp + mag * 4e-6 + 1e-30;

  const auto dev = at::Device(at::kCUDA, 0);
  const auto x = xbuf.to(dev).narrow(1, 0, width);
  const auto w = w_cpu.to(dev);
  const auto nw = c.norm ? nw_cpu.to(dev) : at::Tensor();
  const auto r = c.residual ? r_cpu.to(dev) : at::Tensor();
  at::NoGradGuard no_grad;
  const auto y = decode_linear(x, w, r, nw, 1e-6, c.swiglu);
  gemv_result out;
  if (!y.defined())
    return out;
  out.ran = true;
  out.worst = ((y.cpu().to(at::kDouble) - prod).abs() / bound).max().item<double>();
  const auto xn = c.norm ? rms_norm_composite(x, nw, 1e-6) : c.swiglu ? swiglu_rows(x.contiguous()) : x;
  const auto ref_blas = c.residual ? at::addmm(r, xn, w.t()) : at::mm(xn, w.t());
  out.cublas = ((ref_blas.cpu().to(at::kDouble) - prod).abs() / bound).max().item<double>();
  return out;
}

TEST(decode_gemv, matches_a_float64_reference_within_its_rounding) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  int cases = 0;
  uint64_t seed = 1;
  for (auto dtype : {at::kBFloat16, at::kHalf})
    for (int64_t m : {1, 2, 3, 4})
      for (int prologue : {0, 1, 2})  // none, the norm, SwiGLU
        for (bool residual : {false, true})
          for (auto nk : std::vector<std::pair<int64_t, int64_t>>{{257, 1032}, {1024, 4096}, {96, 40}}) {
            const bool norm = prologue == 1;
            const gemv_case c{m, nk.first, nk.second, norm, residual, dtype, prologue == 2};
            const auto r = run_case(c, seed++);
            SCOPED_TRACE(std::string(c10::toString(dtype)) + " m " + std::to_string(m) + " n "
                         + std::to_string(c.n) + " k " + std::to_string(c.k) + (norm ? " norm" : "")
                         + (c.swiglu ? " swiglu" : "")
                         + (residual ? " residual" : ""));
            ASSERT_TRUE(r.ran) << "the kernel refused a shape it takes";
            // ≤ 1: within the bound; the composite's x̂ and the kernel's can
            // differ by an ulp in an element, worth far less than the bound.
            EXPECT_LE(r.worst, 1.0);
            EXPECT_LE(r.worst, r.cublas + 1.0);
            ++cases;
          }
  EXPECT_EQ(cases, 2 * 4 * 3 * 2 * 3);
}

TEST(decode_gemv, the_qwen3_8b_shapes_at_one_row) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  // qkv (norm), o (+ residual), gate/up (norm), down (+ residual): the
  // decode step's projections; down's k = 12288 stages 24 KiB of x̂.
  for (const auto& c : std::vector<gemv_case>{{1, 6144, 4096, true, false, at::kBFloat16},
                                              {1, 4096, 4096, false, true, at::kBFloat16},
                                              {1, 24576, 4096, true, false, at::kBFloat16},
                                              {4, 4096, 12288, false, true, at::kBFloat16},
                                              {1, 4096, 12288, false, true, at::kBFloat16, true}}) {
    const auto r = run_case(c, 99);
    SCOPED_TRACE("n " + std::to_string(c.n) + " k " + std::to_string(c.k) + " m " + std::to_string(c.m));
    ASSERT_TRUE(r.ran);
    std::printf("n %lld k %lld m %lld: worst error / bound %.3f (cuBLAS %.3f)\n", static_cast<long long>(c.n),
                static_cast<long long>(c.k), static_cast<long long>(c.m), r.worst, r.cublas);
    EXPECT_LE(r.worst, 1.0);
  }
}

TEST(decode_gemv, falls_back_outside_its_limits) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const auto opts = at::TensorOptions().dtype(at::kBFloat16).device(at::kCUDA, 0);
  at::NoGradGuard no_grad;
  const auto w = at::randn({64, 128}, opts);
  EXPECT_TRUE(decode_linear(at::randn({4, 128}, opts), w, {}, {}, 1e-6).defined());
  EXPECT_FALSE(decode_linear(at::randn({5, 128}, opts), w, {}, {}, 1e-6).defined());  // five rows
  EXPECT_FALSE(decode_linear(at::randn({1, 132}, opts), at::randn({64, 132}, opts), {}, {}, 1e-6).defined());
  const auto wide = at::randn({1, 136}, opts);
  EXPECT_FALSE(decode_linear(wide.narrow(1, 1, 128), w, {}, {}, 1e-6).defined());  // x 2 bytes off alignment
  EXPECT_FALSE(decode_linear(at::randn({1, 128}, opts.dtype(at::kFloat)), w.to(at::kFloat), {}, {}, 1e-6).defined());
}

} // namespace
