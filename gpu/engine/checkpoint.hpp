#pragma once
/// Drafter checkpoints on disk, the torch-free half (actors/ include it,
/// through drafter_engine.hpp too): writing a snapshot from
/// drafter_engine::snapshot as a checkpoint folder, reading back its extra
/// state.  The folder's layout and the torch side (snapshot payloads,
/// read_checkpoint) are in checkpoint_io.hpp; all of them are defined in
/// checkpoint_io.cpp.  Any thread.

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "gpu/transport/transport.hpp"

namespace tandem::gpu {

/// Writes the snapshot `snap` (from drafter_engine::snapshot; not released)
/// as `dir`: first `dir`.tmp/ {weights.safetensors (z-lab names, fp32),
/// optimizer.safetensors (exp_avg.<name>, exp_avg_sq.<name>, step),
/// state.json (with a CRC-32C of every tensor)}, each fsynced, then swapped
/// into place atomically (an existing `dir` is replaced; a crash leaves
/// either the old or the new checkpoint), then `latest` in its parent
/// names it (write_latest).  `extra_json` (the runtime's cursor and ledger;
/// JSON text or "") is stored verbatim in state.json.  Any thread.  Throws
/// gpu::error(bad_input) on failure, naming the path; when the disk is full
/// (or would be: the space is checked first) the message gives the bytes
/// needed and free, the .tmp folder is removed and the previous
/// checkpoints are untouched.  `durable` false (restore points, which
/// outlive the process, not the machine): the same steps without fsync.
void write_checkpoint(transport::handle snap, const std::filesystem::path& dir,
                      const std::string& extra_json, bool durable = true);

/// The `extra_json` a checkpoint was written with, verbatim.  Throws
/// gpu::error(bad_input) naming the file for a missing or malformed state.json.
std::string read_checkpoint_extra(const std::filesystem::path& dir);

/// The folder name of the checkpoint of `step`: step-<k>, zero-padded to 8
/// digits (so names sort as steps do up to 10^8).
std::string checkpoint_name(int64_t step);

/// `root`/latest names the newest checkpoint written (its folder name, one
/// line), replaced atomically (write, fsync, rename, fsync the folder) after
/// the checkpoint itself is in place.  For people and tools: a kill between
/// the checkpoint's rename and this update leaves it one behind, so
/// find_resume_checkpoint trusts what it verifies, not this pointer.
void write_latest(const std::filesystem::path& root, const std::string& name, bool durable = true);

/// What `root`/latest names ("" when there is none).
std::string read_latest(const std::filesystem::path& root);

/// The complete checkpoint folders under `root` (step-<k> holding a
/// state.json; never a .tmp, .old or .corrupt), newest step first.
std::vector<std::filesystem::path> list_checkpoints(const std::filesystem::path& root);

/// Reads checkpoint `dir` whole and checks it: state.json's fields, every
/// tensor present with its shape, dtype and CRC-32C.  Throws
/// gpu::error(bad_input) naming the file and the field or tensor at fault.
void verify_checkpoint(const std::filesystem::path& dir);

/// What `tandem run --resume` continues from.
struct resume_lookup {
  std::filesystem::path dir;          ///< empty: no complete checkpoint under the root
  int64_t step = -1;
  std::vector<std::string> warnings;  ///< each checkpoint skipped (and why), a stale `latest`
};

/// The newest checkpoint under `root` that verifies.  A newer one that does
/// not (torn, truncated, bit-flipped) is renamed to <name>.corrupt, out of
/// the way of later lookups and rotation, and named in `warnings`.
resume_lookup find_resume_checkpoint(const std::filesystem::path& root);
/// The same over several roots (the checkpoints and the restore points in
/// shared memory): the newest that verifies in any of them; of equal
/// steps, the earlier root's.  Only what is newer than the result is read.
resume_lookup find_resume_checkpoint(const std::vector<std::filesystem::path>& roots);

/// Deletes the oldest complete checkpoints under `root` until the newest
/// `keep` remain (keep ≤ 0: none deleted); never `protect`.  Also removes
/// the step-<k>.tmp folders of killed writes (call it from the only writer,
/// after a write).  Returns what it removed.
std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& root, int keep,
                                                      const std::filesystem::path& protect);
/// The same, never deleting any of `protect`.
std::vector<std::filesystem::path> rotate_checkpoints(const std::filesystem::path& root, int keep,
                                                      const std::vector<std::filesystem::path>& protect);

/// Removes the step-<k>.tmp folders under `root` (killed writes'; call it
/// from the only writer).  Returns what it removed.
std::vector<std::filesystem::path> remove_killed_writes(const std::filesystem::path& root);

/// One checkpoint's size on disk for a drafter of `parameters` trainable
/// parameters (fp32 weights and two fp32 moments, 12 bytes each, + 64 KiB).
uint64_t checkpoint_bytes(int64_t parameters);

/// Bytes free to this user on the file system that holds `p` (its nearest
/// existing ancestor); UINT64_MAX when that cannot be asked.
uint64_t available_bytes(const std::filesystem::path& p);

/// The bytes of the regular files under `dir`.
uint64_t folder_bytes(const std::filesystem::path& dir);

/// "12.6 GiB".
std::string human_bytes(uint64_t n);

/// Deletes the checkpoints in `root` — its step-* entries (their .tmp, .old
/// and .corrupt forms too), `latest` and `latest.tmp` — and then `root`
/// itself if that left it empty; anything else in it stays (a folder a user
/// named may hold their own files).  Nothing when `root` does not exist.
/// Not std::filesystem::remove_all, which libtorch.so exports a broken copy
/// of (checkpoint_io.cpp, remove_tree).
void remove_checkpoints(const std::filesystem::path& root);

/// Whether `name` is an entry remove_checkpoints deletes.
bool is_checkpoint_entry(const std::string& name);

} // namespace tandem::gpu
