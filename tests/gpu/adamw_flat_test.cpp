// The flat optimizer path (adamw::step_flat, gpu/kernels/adamw_flat.cu)
// against torch::nn::utils::clip_grad_norm_ + torch::optim::AdamW on the same
// GPU: masters, moments, the bf16 model copy, the norm and the skip rule.
#include <cstdio>
#include <limits>

#include <gtest/gtest.h>

#include "gpu/engine/adamw.hpp"
#include "gpu/device/error.hpp"
#include "gpu/pch.hpp"
#include "tests/gpu/fixtures.hpp"

using namespace tandem::gpu;
using tandem::gpu::test::have_cuda;
using tandem::gpu::test::rel_err;

namespace {

/// Parameters of awkward sizes (not multiples of 8) as views of one padded
/// flat buffer, as the drafter engine lays them out.
struct flat_params {
  at::Tensor flat;
  std::vector<at::Tensor> views;
  std::vector<int64_t> offsets;
};

flat_params make_flat(const std::vector<at::Tensor>& init) {
  flat_params f;
  int64_t n = 0;
  for (const auto& t : init) {
    f.offsets.push_back(n);
    n += (t.numel() + 7) / 8 * 8;
  }
  f.flat = at::zeros({n}, init.front().options());
  for (size_t i = 0; i < init.size(); ++i) {
    f.views.push_back(f.flat.narrow(0, f.offsets[i], init[i].numel()).view(init[i].sizes()));
    f.views.back().copy_(init[i]);
  }
  return f;
}

void run_parity(at::ScalarType grad_type) {
  const auto dev = at::Device(at::kCUDA, 0);
  auto g = at::make_generator<at::CPUGeneratorImpl>(5);
  std::vector<at::Tensor> init;
  for (auto shape : std::vector<std::vector<int64_t>>{{37, 19}, {13}, {4, 4, 4}, {1000, 3}})
    init.push_back(at::randn(shape, g).to(dev));
  auto fp = make_flat(init);
  auto model = at::zeros({fp.flat.numel()}, at::TensorOptions().dtype(at::kBFloat16).device(dev));
  std::vector<at::Tensor> ref, start;
  for (auto& t : init) {
    ref.push_back(t.clone().requires_grad_(true));
    start.push_back(t.clone());
  }
  adamw_options o;
  o.lr = 1e-2;
  o.weight_decay = 0.1;
  o.grad_clip = 1.0;
  o.warmup_ratio = 0.25;
  o.total_steps = 12;
  adamw opt(fp.views, o, fp.flat);
  auto lr_of = [&](int64_t t) { return scheduled_lr(o, t); };
  torch::optim::AdamW reference(ref, torch::optim::AdamWOptions(o.lr).betas({0.9, 0.95}).eps(1e-8).weight_decay(0.1));
  int clipped = 0;
  auto grad = at::zeros({fp.flat.numel()}, at::TensorOptions().dtype(grad_type).device(dev));
  for (int64_t t = 1; t <= 12; ++t) {
    const double scale = (t % 3 == 0) ? 0.005 : 0.1;
    for (size_t i = 0; i < init.size(); ++i) {
      auto gi = (at::randn(init[i].sizes(), g) * scale).to(dev).to(grad_type);
      grad.narrow(0, fp.offsets[i], init[i].numel()).copy_(gi.reshape({-1}));
      ref[i].mutable_grad() = gi.to(at::kFloat);  // bf16 → fp32 is exact
    }
    auto st = opt.step_flat(grad, model, at::tensor(1.0f, at::TensorOptions().device(dev)));
    const double norm = torch::nn::utils::clip_grad_norm_(ref, 1.0);
    clipped += norm > 1.0;
    static_cast<torch::optim::AdamWOptions&>(reference.param_groups()[0].options()).lr(static_cast<float>(lr_of(t)));
    reference.step();
    EXPECT_NEAR(st.grad_norm.item<double>(), norm, 1e-5 * norm) << "step " << t;
    EXPECT_EQ(st.skipped.item<float>(), 0.0f);
  }
  EXPECT_GE(clipped, 4);
  EXPECT_LE(clipped, 10);
  EXPECT_EQ(opt.step_count().item<float>(), 12.0f);
  for (size_t i = 0; i < init.size(); ++i) {
    const double change = (ref[i].detach() - start[i]).norm().item<double>();
    const double err = (fp.views[i] - ref[i].detach()).norm().item<double>() / change;
    std::printf("  %s grads, param %zu: |flat - torch| / |change| = %.2e (tolerance 1e-5)\n",
                c10::toString(grad_type), i, err);
    // Tolerance as the CPU test of adamw::step (tests/unit/engine_test.cpp):
    // the same float32 update in another operation order.
    EXPECT_LE(err, 1e-5);
    auto& state = static_cast<torch::optim::AdamWParamState&>(*reference.state().at(ref[i].unsafeGetTensorImpl()));
    EXPECT_LE(rel_err(opt.exp_avg()[i], state.exp_avg()), 1e-6);
    EXPECT_LE(rel_err(opt.exp_avg_sq()[i], state.exp_avg_sq()), 1e-6);
    // The model copy is the masters rounded, exactly.
    auto mv = model.narrow(0, fp.offsets[i], init[i].numel()).view(init[i].sizes());
    EXPECT_TRUE(at::equal(mv, fp.views[i].to(at::kBFloat16))) << "param " << i;
  }
  // Padding stays zero.
  auto padding = at::ones({fp.flat.numel()}, at::TensorOptions().dtype(at::kBool).device(dev));
  for (size_t i = 0; i < init.size(); ++i)
    padding.narrow(0, fp.offsets[i], init[i].numel()).fill_(false);
  EXPECT_GT(padding.sum().item<int64_t>(), 0);
  EXPECT_EQ(fp.flat.masked_select(padding).abs().sum().item<double>(), 0.0);
  EXPECT_EQ(model.masked_select(padding).abs().sum().item<double>(), 0.0);
}

} // namespace

TEST(adamw_flat, matches_torch_optim_adamw_with_bf16_gradients) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  run_parity(at::kBFloat16);
}

TEST(adamw_flat, matches_torch_optim_adamw_with_fp32_gradients) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  run_parity(at::kFloat);
}

TEST(adamw_flat, skips_everything_on_a_non_finite_loss_or_gradient) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const auto dev = at::Device(at::kCUDA, 0);
  auto fp = make_flat({at::ones({5}, at::TensorOptions().device(dev)), at::ones({3, 3}, at::TensorOptions().device(dev))});
  adamw_options o;
  o.lr = 0.1;
  adamw opt(fp.views, o, fp.flat);
  auto model = fp.flat.to(at::kBFloat16);
  auto grad = at::ones({fp.flat.numel()}, model.options());
  const auto before = fp.flat.clone(), model_before = model.clone();
  auto nan = at::tensor(std::numeric_limits<float>::quiet_NaN(), at::TensorOptions().device(dev));
  auto st = opt.step_flat(grad, model, nan);
  EXPECT_EQ(st.skipped.item<float>(), 1.0f);
  grad[3] = std::numeric_limits<float>::infinity();
  st = opt.step_flat(grad, model, at::tensor(1.0f, at::TensorOptions().device(dev)));
  EXPECT_EQ(st.skipped.item<float>(), 1.0f);
  EXPECT_TRUE(at::equal(fp.flat, before));
  EXPECT_TRUE(at::equal(model, model_before));
  EXPECT_EQ(opt.step_count().item<float>(), 0.0f);
  EXPECT_EQ(opt.exp_avg()[0].abs().sum().item<float>(), 0.0f);
  grad[3] = 1.0;
  st = opt.step_flat(grad, model, at::tensor(1.0f, at::TensorOptions().device(dev)));
  EXPECT_EQ(st.skipped.item<float>(), 0.0f);
  EXPECT_EQ(opt.step_count().item<float>(), 1.0f);
  EXPECT_FALSE(at::equal(fp.flat, before));
}

TEST(adamw_flat, refuses_parameters_outside_the_flat_buffer) {
  if (!have_cuda())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  const auto dev = at::Device(at::kCUDA, 0);
  auto flat = at::zeros({16}, at::TensorOptions().device(dev));
  std::vector<at::Tensor> stray{at::zeros({4}, flat.options())};
  EXPECT_THROW(adamw(stray, adamw_options{}, flat), tandem::gpu::error);
  EXPECT_THROW(adamw({flat.narrow(0, 0, 4)}, adamw_options{}, at::zeros({12}, flat.options())), tandem::gpu::error);
}
