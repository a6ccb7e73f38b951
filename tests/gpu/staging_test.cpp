// Prefetch staging: packed batches from pinned host memory to the device on a
// copy stream, ordered by an event (no host synchronise).  The CUDA case
// reports SKIPPED without a GPU; the CPU pass-through runs everywhere.
#include <filesystem>

#include <gtest/gtest.h>

#include "bench/data_bench.hpp"
#include "gpu/data/dataset.hpp"
#include "gpu/data/packer.hpp"
#include "gpu/data/staging.hpp"
#include "gpu/pch.hpp"

namespace fs = std::filesystem;
using namespace tandem::gpu::data;

namespace {

fs::path small_dataset() {
  auto dir = fs::temp_directory_path() / ("tandem_staging_" + std::to_string(::getpid()));
  if (!fs::exists(dir / "manifest.json")) {
    synthetic_spec spec;
    spec.samples = 64;
    spec.min_length = 20;
    spec.max_length = 200;
    spec.vocab_size = 1000;
    spec.shards = 2;
    write_synthetic_dataset(dir, spec);
  }
  return dir;
}

} // namespace

TEST(staging, cpu_passes_batches_through) {
  dataset ds(small_dataset());
  packer_options o;
  o.rows = 2;
  o.seq_len = 256;
  auto p = make_epoch_packer(ds, 1, 0, 1, o);
  stager s(at::kCPU);
  auto b = p.next();
  ASSERT_TRUE(b.has_value());
  auto d = s.stage(*b);
  EXPECT_TRUE(d.tokens.is_same(b->tokens));
  EXPECT_EQ(d.sample_ids, b->sample_ids);
}

TEST(staging, copies_to_gpu_on_copy_stream_and_orders_by_event) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "SKIPPED: no CUDA device";
  dataset ds(small_dataset());
  packer_options o;
  o.rows = 4;
  o.seq_len = 512;
  o.pinned = true;
  auto p = make_epoch_packer(ds, 7, 0, 1, o);
  const at::Device dev(at::kCUDA, 0);
  stager s(dev);
  int64_t batches = 0;
  while (auto b = p.next()) {
    ASSERT_TRUE(b->tokens.is_pinned());
    auto d = s.stage(*b);
    EXPECT_EQ(d.tokens.device(), dev);
    // The consumer's stream waits on the event, then reads.
    c10::cuda::CUDAStreamGuard consumer(c10::cuda::getStreamFromPool(false, 0));
    d.wait_on_current_stream();
    auto sum = d.tokens.to(at::kLong).sum() + d.loss_mask.to(at::kLong).sum() + d.doc_lengths.sum();
    auto expect = b->tokens.to(at::kLong).sum() + b->loss_mask.to(at::kLong).sum() + b->doc_lengths.sum();
    EXPECT_EQ(sum.item<int64_t>(), expect.item<int64_t>()) << "batch " << batches;
    EXPECT_TRUE(at::equal(d.tokens.cpu(), b->tokens));
    ++batches;
  }
  EXPECT_GT(batches, 0);
}
