#pragma once
/// Drafter checkpoints on disk and snapshots in transport (gpu/ only).
///
/// A checkpoint folder holds
///   weights.safetensors    the fp32 master weights under z-lab names
///   optimizer.safetensors  exp_avg.<name>, exp_avg_sq.<name> (fp32), step (fp32 [])
///   state.json             {format, version, step, generator {device, state (hex)},
///                           parameters [names, in order], drafter {shape fields},
///                           options {the engine's options}, extra (the runtime's
///                           JSON text, verbatim)}
/// A snapshot payload is [state.json text as uint8, step, weights…, exp_avg…,
/// exp_avg_sq…], every tensor a CPU fp32 copy, P of each kind, in the order
/// of state.json's `parameters`.

#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "gpu/pch.hpp"
#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

inline const std::string checkpoint_format = "tandem.drafter_checkpoint";
inline constexpr int checkpoint_version = 1;

struct snapshot_parts {
  std::string state;                   ///< state.json without `extra`
  std::vector<at::Tensor> weights;     ///< CPU fp32
  std::vector<at::Tensor> exp_avg;     ///< CPU fp32
  std::vector<at::Tensor> exp_avg_sq;  ///< CPU fp32
  at::Tensor step;                     ///< CPU fp32 []
};

transport::handle publish_snapshot(const snapshot_parts& parts);

/// The weights of snapshot `snap` (not released): its state (state.json's
/// fields, without `extra`), the parameter names in order and the CPU fp32
/// weights (views of the snapshot's own tensors: copy them before the
/// handle is released).  Throws gpu::error(bad_input) for a handle that is
/// not a drafter snapshot.
struct snapshot_weights {
  nlohmann::json state;
  std::vector<std::string> names;
  std::vector<at::Tensor> weights;
  int64_t step = 0;
};
snapshot_weights read_snapshot_weights(transport::handle snap);

/// A checkpoint read back and checked for consistency with itself (every
/// listed parameter present with its moments of the same shape, fp32; step
/// in state.json = the optimizer's).  Tensors are CPU, read-only mappings.
struct checkpoint_contents {
  nlohmann::json state;
  std::vector<std::string> names;
  std::vector<at::Tensor> weights, exp_avg, exp_avg_sq;
  int64_t step = 0;
};

/// Throws gpu::error(bad_input) naming the file and the field or tensor.
checkpoint_contents read_checkpoint(const std::filesystem::path& dir);

} // namespace tandem::gpu
