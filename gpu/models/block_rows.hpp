#pragma once
/// The drafter's block-row moves as differentiable ops.  On CUDA, for
/// contiguous operands whose rows are a multiple of 16 bytes at 16-byte
/// aligned addresses, each direction is one gather kernel
/// (gpu/kernels/block_rows.hpp); otherwise the composite (narrow and copy,
/// cat of an expand).  Both give the same bits forward and backward: these
/// are copies (tests/gpu/block_rows_test.cpp).  Rows are the trailing
/// dimensions; B·N blocks of `block_size` rows.

#include <string>

#include "gpu/pch.hpp"

namespace tandem::gpu {

/// t [B, N·Bs, …] → [B, N·(Bs−1), …]: positions 1 … Bs−1 of every block.
at::Tensor drop_block_firsts(const at::Tensor& t, int64_t block_size);

/// rows [B·N + 1, o] — the B·N blocks' anchor rows, then the mask token's —
/// → [B, N·Bs, o]: a block's anchor row at its position 0, the mask row at
/// the others.  The backward sums the mask row's Bs − 1 copies with ATen's
/// sum over them (as the expand's backward did).
at::Tensor spread_block_rows(const at::Tensor& rows, int64_t batch, int64_t blocks, int64_t block_size);

/// "cuda kernel", or "composite: <why>" for an operand of the ops above.
std::string block_rows_path(const at::Tensor& t);

} // namespace tandem::gpu
