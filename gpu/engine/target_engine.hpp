#pragma once
/// The target actor's engine: the frozen Qwen3 target on one device, turning
/// a staged batch into its fused taps (DFLASH.md "Training step" 1).
/// Torch-free facade (actors/ include it): tensors cross only as transport
/// handles.  Single owner: construct it and call it on one thread (the
/// actor's), which is also where its device work runs.

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

struct target_engine_options {
  std::filesystem::path dir;      ///< Hugging Face layout: config.json + *.safetensors
  int32_t device = -1;            ///< CUDA ordinal; −1 = CPU
  std::string dtype = "auto";     ///< auto (bf16 on CUDA, fp32 on the CPU), float32, bfloat16
  std::vector<int64_t> tap_ids;   ///< 0-indexed decoder layers; empty = DFLASH.md's 5 taps
};

struct target_info {
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        ///< D; the taps are [B, S, n·D]
  int64_t num_layers = 0;         ///< of the checkpoint (only those up to the deepest tap are loaded)
  std::vector<int64_t> tap_ids;
  std::string dtype;              ///< of weights and taps: "float32" or "bfloat16"
  int32_t device = -1;
  /// The forward's path: "packed (graphs)", "packed", or "mask (why)"
  /// (qwen3_target::packed_path; TANDEM_TARGET_PATH chooses for A/B runs).
  std::string path;
};

class target_engine {
public:
  /// Loads the config and the layers up to the deepest tap onto the device,
  /// on the calling thread.  Throws gpu::error: bad_input (a bad checkpoint
  /// or option; the message names the file or option), device_unavailable.
  explicit target_engine(const target_engine_options& opts);
  ~target_engine();
  target_engine(target_engine&&) noexcept;
  target_engine& operator=(target_engine&&) noexcept;

  const target_info& info() const;

  /// `batch` names the payload {tokens [B, S] int32/int64, loss_mask [B, S],
  /// doc_lengths [B, K] int64} (a prefetch's, possibly on another device);
  /// it is only read, never released.  Runs the target up to the deepest tap
  /// (packed documents attend within themselves) and publishes {taps
  /// [B, S, n·D]} on this engine's device, in its dtype, with a ready event
  /// on a GPU.  The caller owns the returned handle and releases it once the
  /// consumer is done.  Throws gpu::error(bad_input) for an unknown handle
  /// or a malformed payload.
  transport::handle forward(transport::handle batch);

private:
  struct impl;
  std::unique_ptr<impl> impl_;
};

} // namespace tandem::gpu
