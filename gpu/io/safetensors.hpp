#pragma once
/// Reading and writing safetensors checkpoints (the Hugging Face format).
///
/// File layout: an 8-byte little-endian header length N, N bytes of JSON
/// (`{"__metadata__": {str: str}, name: {"dtype", "shape", "data_offsets"}}`,
/// padded with spaces), then the tensor data; `data_offsets` are
/// [begin, end) relative to the start of the data and tile it exactly.
///
/// Loading maps each file read-only and returns zero-copy CPU tensors over
/// the mapping; the mapping lives until the last of its tensors dies. Every
/// malformed input throws gpu::error(errc::bad_input) naming the file and
/// the tensor or field at fault.

#include <filesystem>
#include <map>
#include <optional>
#include <string>

#include <ATen/core/Tensor.h>
#include <c10/core/ScalarType.h>
#include <c10/util/ArrayRef.h>

#include "gpu/device/error.hpp"

namespace tandem::gpu {

/// The tensors and the `__metadata__` of a checkpoint.
struct safetensors_file {
  std::map<std::string, at::Tensor> tensors;
  std::map<std::string, std::string> metadata;
};

/// Reads `p`: a `.safetensors` file, a sharded checkpoint's
/// `*.safetensors.index.json`, or a directory holding `model.safetensors`
/// (preferred) or `model.safetensors.index.json` plus its shards.
///
/// Tensors are CPU tensors that alias the read-only file mapping: clone or
/// convert before writing to them (an in-place write faults). A tensor whose
/// data is not aligned to its element size inside the file (never the case
/// for files written by the Python library or by save_safetensors) is copied.
/// For a sharded checkpoint the result holds exactly the tensors of the
/// index's `weight_map`, and `metadata` is the shards' `__metadata__`
/// overridden by the index's `metadata` (non-string values as JSON text).
safetensors_file read_safetensors(const std::filesystem::path& p);

/// read_safetensors(p).tensors.
std::map<std::string, at::Tensor> load_safetensors(const std::filesystem::path& p);

/// Writes `tensors` (any device, any strides) and `metadata` to `p` in the
/// layout of the Python library (tensors ordered by dtype, widest first,
/// then by name, so each is aligned to its element size; an empty
/// `metadata` writes no `__metadata__`). Atomic: writes `p` + ".tmp",
/// fsyncs, renames over `p`. The parent directory must exist.  `durable`
/// false: no fsync — atomic against the process dying (the page cache
/// keeps what was written), not against the machine losing power.
void save_safetensors(const std::filesystem::path& p,
                      const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata = {}, bool durable = true);

/// Returns tensors[name] after checking its shape and dtype; throws
/// bad_input naming `file_for_messages`, the tensor, and expected vs actual.
at::Tensor require_tensor(const std::map<std::string, at::Tensor>& tensors,
                          const std::string& name, at::IntArrayRef shape, at::ScalarType dtype,
                          const std::string& file_for_messages);

/// The safetensors name of a dtype ("BF16"), or nullopt if the format (as
/// Tandem supports it) cannot hold it.
std::optional<std::string> safetensors_dtype_name(at::ScalarType dtype);

} // namespace tandem::gpu
