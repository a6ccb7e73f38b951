#pragma once
// Hopper warpgroup MMA (wgmma.mma_async, sm_90a only) for the DFlash
// attention's backward: the few PTX wrappers it needs, and the shared-memory
// layout they read.  Facts from the PTX ISA ("Asynchronous Warpgroup Level
// Matrix Multiply-Accumulate"):
//   - a warpgroup is 4 consecutive warps (128 threads, the first warp a
//     multiple of 4); every thread of it issues each wgmma;
//   - the accumulator of m64nN, and an A operand taken from registers, are
//     per warp w of the group the mma.sync m16n8k16 C and A fragments of
//     rows 16w..16w+15 (lane = 4g + t4): d[4i + 0..1] = (g, 8i + 2t4 + 0..1),
//     d[4i + 2..3] = (g + 8, same columns);
//   - operands in shared memory are described by a 64-bit descriptor: start
//     address, leading and stride byte offsets (>> 4 each), swizzle mode.
//
// Layout used here, 16-bit elements, "128-byte swizzle": a [rows][cols]
// tile is stored as panels of 64 columns (rows × 128 bytes each, one after
// the other); inside a panel, 8-row atoms of 1024 bytes; the 16-byte chunk
// c of row r sits at chunk c ^ (r % 8) of its 128-byte row.  Tiles start on
// 1024-byte boundaries.  Read K-major (the contiguous columns are the k
// dimension): stride byte offset 1024 (the next 8 rows); the k step of 16
// elements inside a panel moves the start address by 32 bytes.  Read
// N-major (rows are k, columns n: a B operand [k][n] stored row-major): one
// k step of 16 rows is two atoms (2048 bytes); the panels are the n
// direction.

#include <cstdint>

namespace tandem::gpu::kernels::wg {

/// Byte offset of element (r, c) of a [rows][cols] tile in the layout above.
__device__ __forceinline__ uint32_t sw128(int rows, int r, int c) {
  return static_cast<uint32_t>((c >> 6) * rows * 128 + (r >> 3) * 1024 + (r & 7) * 128
                               + ((((c >> 3) & 7) ^ (r & 7)) << 4) + (c & 7) * 2);
}

/// Descriptor of a 128-byte-swizzled operand at shared address `addr`.
__device__ __forceinline__ uint64_t desc(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>(lbo >> 4) << 16)
         | (static_cast<uint64_t>(sbo >> 4) << 32) | (1ull << 62);
}

/// K-major operand: k step `ks` (16 elements) of a tile with `rows` rows at
/// shared address `tile`.  The leading byte offset is unused (one panel
/// holds each k step).
__device__ __forceinline__ uint64_t desc_k(uint32_t tile, int rows, int ks) {
  return desc(tile + (ks >> 2) * rows * 128 + (ks & 3) * 32, 16, 1024);
}

/// N-major operand: k step `ks` (rows 16·ks..) of a tile with `rows` rows;
/// leading byte offset = the next 64 columns (panel), stride byte offset =
/// the next 8 rows (measured on an H200: the other order reads garbage).
__device__ __forceinline__ uint64_t desc_n(uint32_t tile, int rows, int ks) {
  return desc(tile + ks * 2048, rows * 128, 1024);
}

// The wrappers compile everywhere; their bodies exist only in sm_90a device
// code (TANDEM_HAS_WGMMA), where callers must keep them.
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
#define TANDEM_HAS_WGMMA 1
#define TANDEM_WGMMA_ASM(...) asm volatile(__VA_ARGS__)
inline constexpr bool compiled = true;
#else
#define TANDEM_WGMMA_ASM(...) do {} while (0)
inline constexpr bool compiled = false;  ///< this pass has no wgmma (callers fall back)
#endif

/// Orders register writes before the wgmmas that read them.
__device__ __forceinline__ void fence() {
  TANDEM_WGMMA_ASM("wgmma.fence.sync.aligned;\n" ::: "memory");
}

__device__ __forceinline__ void commit() {
  TANDEM_WGMMA_ASM("wgmma.commit_group.sync.aligned;\n" ::: "memory");
}

/// Waits until at most `pending` committed groups are in flight.
template <int pending>
__device__ __forceinline__ void wait() {
  TANDEM_WGMMA_ASM("wgmma.wait_group.sync.aligned %0;\n" ::"n"(pending) : "memory");
}

/// Makes this thread's generic-proxy shared-memory writes (st.shared,
/// completed cp.async) visible to the async proxy that wgmma reads through.
__device__ __forceinline__ void fence_proxy_async() {
  TANDEM_WGMMA_ASM("fence.proxy.async.shared::cta;\n" ::: "memory");
}

// The accumulator operands: d[0..31] (n = 64) or d[0..63] (n = 128), as the
// asm output list and as the instruction's register vector.
#define TANDEM_WGMMA_D32_OUT \
  "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), \
  "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), \
  "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), \
  "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), \
  "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
#define TANDEM_WGMMA_D64_OUT TANDEM_WGMMA_D32_OUT, \
  "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), \
  "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), \
  "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), \
  "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), \
  "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
#define TANDEM_WGMMA_D32_REGS \
  "%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, " \
  "%16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, " \
  "%30, %31"
#define TANDEM_WGMMA_D64_REGS TANDEM_WGMMA_D32_REGS ", " \
  "%32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, " \
  "%46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, " \
  "%60, %61, %62, %63"

// d[32] += A (descriptor a) · B (descriptor b), both K-major.
#define TANDEM_WGMMA_SS_N64(TY) \
  TANDEM_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n" \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" \
                   TANDEM_WGMMA_D32_REGS "}, %32, %33, p, 1, 1, 0, 0;\n}\n" \
                   : TANDEM_WGMMA_D32_OUT \
                   : "l"(a), "l"(b), "r"(scale_d))

// d[32] += A (registers a[4]) · B (descriptor b, K-major).
#define TANDEM_WGMMA_RS_N64(TY) \
  TANDEM_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n" \
                   "wgmma.mma_async.sync.aligned.m64n64k16.f32." TY "." TY " {" \
                   TANDEM_WGMMA_D32_REGS "}, {%32, %33, %34, %35}, %36, p, 1, 1, 0;\n}\n" \
                   : TANDEM_WGMMA_D32_OUT \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d))

// d[64] += A (registers a[4]) · B (descriptor b, N-major).
#define TANDEM_WGMMA_RS_N128_TB(TY) \
  TANDEM_WGMMA_ASM("{\n.reg .pred p;\nsetp.ne.b32 p, %69, 0;\n" \
                   "wgmma.mma_async.sync.aligned.m64n128k16.f32." TY "." TY " {" \
                   TANDEM_WGMMA_D64_REGS "}, {%64, %65, %66, %67}, %68, p, 1, 1, 1;\n}\n" \
                   : TANDEM_WGMMA_D64_OUT \
                   : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(b), "r"(scale_d))

/// d (64 × 64, fp32) = (scale_d ? d : 0) + A·B: A 64 × 16 and B 16 × 64, both
/// from shared memory, K-major; bf16 (is_bf16) or fp16 inputs.
template <bool is_bf16>
__device__ __forceinline__ void mma_ss_n64(float (&d)[32], uint64_t a, uint64_t b, int scale_d) {
  if constexpr (is_bf16)
    TANDEM_WGMMA_SS_N64("bf16");
  else
    TANDEM_WGMMA_SS_N64("f16");
}

/// d (64 × 64, fp32) = (scale_d ? d : 0) + A·B: A 64 × 16 from registers
/// (mma.sync A fragments, warp w holding rows 16w..), B 16 × 64 from shared
/// memory, K-major.
template <bool is_bf16>
__device__ __forceinline__ void mma_rs_n64(float (&d)[32], const uint32_t (&a)[4], uint64_t b,
                                           int scale_d) {
  if constexpr (is_bf16)
    TANDEM_WGMMA_RS_N64("bf16");
  else
    TANDEM_WGMMA_RS_N64("f16");
}

/// d (64 × 128, fp32) = (scale_d ? d : 0) + A·B: A 64 × 16 from registers, B
/// 16 × 128 from shared memory, N-major.
template <bool is_bf16>
__device__ __forceinline__ void mma_rs_n128_tb(float (&d)[64], const uint32_t (&a)[4], uint64_t b,
                                               int scale_d) {
  if constexpr (is_bf16)
    TANDEM_WGMMA_RS_N128_TB("bf16");
  else
    TANDEM_WGMMA_RS_N128_TB("f16");
}

#undef TANDEM_WGMMA_SS_N64
#undef TANDEM_WGMMA_RS_N64
#undef TANDEM_WGMMA_RS_N128_TB
#undef TANDEM_WGMMA_D64_REGS
#undef TANDEM_WGMMA_D32_REGS
#undef TANDEM_WGMMA_D64_OUT
#undef TANDEM_WGMMA_D32_OUT

} // namespace tandem::gpu::kernels::wg
