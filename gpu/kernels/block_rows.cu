#include "gpu/kernels/block_rows.hpp"

#include "gpu/kernels/elem.cuh"

namespace tandem::gpu::kernels {
namespace {

constexpr int threads = 256;

/// The source row of destination row r, or -1 for a row of zeros.
template <block_rows_op Op>
__device__ __forceinline__ int64_t source_row(int64_t r, int64_t blocks, int64_t bs) {
  if constexpr (Op == block_rows_op::drop_first) {
    const int64_t j = r / (bs - 1), i = r - j * (bs - 1);
    return j * bs + i + 1;
  } else {
    const int64_t j = r / bs, i = r - j * bs;
    if constexpr (Op == block_rows_op::undrop_first)
      return i == 0 ? -1 : j * (bs - 1) + i - 1;
    else
      return i == 0 ? j : blocks;
  }
}

/// Grid-stride over the destination's 16-byte vectors.
template <block_rows_op Op>
__global__ void __launch_bounds__(threads) block_rows_kernel(const uint4* __restrict__ src, uint4* __restrict__ dst,
                                                              int64_t blocks, int64_t bs, int64_t vectors_a_row,
                                                              int64_t total) {
  for (int64_t v = int64_t{blockIdx.x} * threads + threadIdx.x; v < total; v += int64_t{gridDim.x} * threads) {
    const int64_t r = v / vectors_a_row, c = v - r * vectors_a_row;
    const int64_t s = source_row<Op>(r, blocks, bs);
    dst[v] = s < 0 ? make_uint4(0, 0, 0, 0) : src[s * vectors_a_row + c];
  }
}

} // namespace

int64_t block_rows_out_rows(const block_rows_args& a) {
  return a.op == block_rows_op::drop_first ? a.blocks * (a.block_size - 1) : a.blocks * a.block_size;
}

cudaError_t block_rows(const block_rows_args& a, cudaStream_t stream) {
  const auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  if (a.blocks < 0 || a.block_size < 2 || a.row_bytes <= 0 || a.row_bytes % 16 != 0 || !a.src || !a.dst
      || !aligned(a.src) || !aligned(a.dst))
    return cudaErrorInvalidValue;
  const int64_t per_row = a.row_bytes / 16, total = block_rows_out_rows(a) * per_row;
  if (total == 0)
    return cudaSuccess;
  const unsigned grid = grid_stride_ctas(total, threads, 132 * 32);
  const auto* s = static_cast<const uint4*>(a.src);
  auto* d = static_cast<uint4*>(a.dst);
  switch (a.op) {
    case block_rows_op::drop_first:
      block_rows_kernel<block_rows_op::drop_first><<<grid, threads, 0, stream>>>(s, d, a.blocks, a.block_size,
                                                                                  per_row, total);
      break;
    case block_rows_op::undrop_first:
      block_rows_kernel<block_rows_op::undrop_first><<<grid, threads, 0, stream>>>(s, d, a.blocks, a.block_size,
                                                                                    per_row, total);
      break;
    case block_rows_op::spread:
      block_rows_kernel<block_rows_op::spread><<<grid, threads, 0, stream>>>(s, d, a.blocks, a.block_size,
                                                                              per_row, total);
      break;
  }
  return cudaGetLastError();
}

} // namespace tandem::gpu::kernels
