#pragma once
/// Row moves of the drafter's block layout — B·N blocks of Bs rows, a row
/// being the trailing dimensions of a [B, N·Bs, …] tensor — done as one
/// 16-byte-vector gather each, where ATen's strided copy and cat kernels ran
/// at an eighth to a half of the memory's rate (docs/bench.md, eighteenth
/// pass).  Pure data movement: the results are the composites' bits.
/// No LibTorch here: raw pointers, sizes and a stream; no allocation, no
/// sync (graph-capturable).  The autograd wrappers and the composites are in
/// gpu/models/block_rows.cpp.
///
/// For destination row r (i = its position in its block, j = its block):
///   drop_first    [B·N·(Bs−1)] ← src row j·Bs + i + 1, i = r mod (Bs−1)
///                 (every block's positions 1 … Bs−1: scored_positions)
///   undrop_first  [B·N·Bs]     ← 0 at i = 0, else src row j·(Bs−1) + i − 1
///                 (drop_first's backward)
///   spread        [B·N·Bs]     ← src row j at i = 0, else src row B·N
///                 (the first layer's distinct rows, anchors then the mask
///                 token's, back to block positions)

#include <cstdint>

#include <cuda_runtime_api.h>

namespace tandem::gpu::kernels {

enum class block_rows_op { drop_first, undrop_first, spread };

struct block_rows_args {
  block_rows_op op = block_rows_op::drop_first;
  int64_t blocks = 0;       ///< B·N
  int64_t block_size = 0;   ///< Bs >= 2
  int64_t row_bytes = 0;    ///< a multiple of 16
  const void* src = nullptr;  ///< 16-byte aligned, rows contiguous
  void* dst = nullptr;        ///< 16-byte aligned, rows contiguous; must not overlap src
};

/// The destination's rows for `op` (see above).
int64_t block_rows_out_rows(const block_rows_args& args);

/// cudaErrorInvalidValue for a bad size, alignment or a null operand;
/// otherwise the launch's error.
cudaError_t block_rows(const block_rows_args& args, cudaStream_t stream);

} // namespace tandem::gpu::kernels
