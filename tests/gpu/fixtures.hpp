#pragma once
/// Inputs shared by the GPU engine tests (graph_test.cpp,
/// data_parallel_test.cpp): the parity fixtures' tiny Qwen3 target and a
/// learnable synthetic batch.

#include <cstdint>
#include <filesystem>

#include "gpu/engine/batch.hpp"
#include "gpu/pch.hpp"

namespace tandem::gpu::test {

/// The parity fixtures' tiny Qwen3 (V 512, D 64, 8 layers; tests/parity/FIXTURES.md).
inline std::filesystem::path tiny_target_dir() {
  return std::filesystem::path(TANDEM_FIXTURES_DIR) / "qwen3_tiny";
}

/// Rows of a repeated random phrase (learnable), two documents in row 0.
inline data::packed_batch phrase_batch(int64_t rows, int64_t seq, uint64_t seed) {
  auto g = at::make_generator<at::CPUGeneratorImpl>(seed);
  auto phrase = at::randint(0, 500, {10}, g, at::kLong);
  data::packed_batch b;
  b.tokens = phrase.repeat({rows, seq / 10 + 1}).narrow(1, 0, seq).contiguous().to(at::kInt);
  b.doc_lengths = at::zeros({rows, 2}, at::kLong);
  b.doc_lengths[0][0] = seq / 2;
  b.doc_lengths[0][1] = seq - seq / 2;
  for (int64_t r = 1; r < rows; ++r)
    b.doc_lengths[r][0] = seq;
  b.loss_mask = at::ones({rows, seq}, at::kByte);
  b.real_tokens = rows * seq;
  return b;
}

} // namespace tandem::gpu::test
