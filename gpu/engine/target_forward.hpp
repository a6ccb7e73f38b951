#pragma once
/// The target's forward as the target engine runs it (and `tandem bench
/// target_forward` times it): qwen3_target::forward_packed, replayed as one
/// CUDA graph per (rows, seq_len, documents a row) on a GPU.  gpu/ only
/// (torch).  Single owner, on its engine's thread.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>

#include "gpu/models/qwen3.hpp"
#include "gpu/pch.hpp"

namespace tandem::gpu {

class target_forward_runner {
public:
  /// `mode`: "graphs" (the default: the packed forward, captured), "eager"
  /// (the packed forward, not captured) or "mask" (the dense-mask path:
  /// qwen3_target::forward with a [B, 1, S, S] mask, the path before the
  /// packed one); empty: TANDEM_TARGET_PATH's value (unset or empty:
  /// "graphs").  Throws gpu::error(bad_input) for another mode.  Where the
  /// packed path cannot run (the CPU, fp32, no FlashAttention-2), every mode
  /// runs the mask path and path() says why.
  target_forward_runner(const qwen3_target& target, at::Device device, const std::string& mode);
  ~target_forward_runner();
  target_forward_runner(const target_forward_runner&) = delete;
  target_forward_runner& operator=(const target_forward_runner&) = delete;

  /// ids [B, S] int64 and doc_lengths [B, K] int64 on the target's device →
  /// taps [B, S, n·D], a tensor of the caller's (not the graph's output).
  at::Tensor taps(const at::Tensor& ids, const at::Tensor& doc_lengths);

  /// "packed (graphs)", "packed", or "mask (why)".
  const std::string& path() const { return path_; }
  int64_t replays() const { return replays_; }
  /// Bytes of the captured graphs' private pools.
  int64_t graph_pool_bytes() const;

private:
  struct graph;
  const qwen3_target& target_;
  at::Device device_;
  std::string path_;
  bool graphs_ = false, mask_ = false;
  int64_t replays_ = 0;
  std::map<std::tuple<int64_t, int64_t, int64_t>, std::unique_ptr<graph>> graphs_by_shape_;
};

} // namespace tandem::gpu
