#pragma once
/// Drafter checkpoints on disk, the torch-free half (actors/ include it,
/// through drafter_engine.hpp too): writing a snapshot from
/// drafter_engine::snapshot as a checkpoint folder, reading back its extra
/// state.  The folder's layout and the torch side (snapshot payloads,
/// read_checkpoint) are in checkpoint_io.hpp; all of them are defined in
/// checkpoint_io.cpp.  Any thread.

#include <filesystem>
#include <string>

#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

/// Writes the snapshot `snap` (from drafter_engine::snapshot; not released)
/// as `dir`: first `dir`.tmp/ {weights.safetensors (z-lab names, fp32),
/// optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>, step),
/// state.json}, each fsynced, then swapped into place atomically (an
/// existing `dir` is replaced; a crash leaves either the old or the new
/// checkpoint).  `extra_json` (the runtime's cursor and ledger; JSON text or
/// "") is stored verbatim in state.json.  Any thread.  Throws
/// gpu::error(bad_input) on failure, naming the path.
void write_checkpoint(transport::handle snap, const std::filesystem::path& dir,
                      const std::string& extra_json);

/// The `extra_json` a checkpoint was written with, verbatim.  Throws
/// gpu::error(bad_input) naming the file for a missing or malformed state.json.
std::string read_checkpoint_extra(const std::filesystem::path& dir);

} // namespace tandem::gpu
