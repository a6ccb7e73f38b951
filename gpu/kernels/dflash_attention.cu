// DFlash KV-injection attention: forward and backward over the visible keys
// only (see dflash_attention.hpp for the layout and the design).
//
// Fragment layouts (PTX ISA, mma.m16n8k16, 16-bit inputs): lane = 4·g + t4.
//   A 16×16 (row-major):  a0 (g, 2t4..+1)  a1 (g+8, 2t4..)  a2 (g, 2t4+8..)  a3 (g+8, 2t4+8..)
//   B 16×8  (k × n):      b0 (k = 2t4..+1, n = g)           b1 (k = 2t4+8.., n = g)
//   C 16×8  (fp32):       c0,c1 (g, 2t4..+1)                c2,c3 (g+8, 2t4..+1)
// ldmatrix.x4 takes lane l's address as row (l & 7) of matrix l >> 3 and
// returns matrix i in register i with lane l holding row l >> 2, columns
// 2(l & 3)..+1 (.trans: the transposed matrix).  So with row-major tiles in
// shared memory (row pitch RS = d + 8 elements: 16 bytes of padding keep the
// eight rows of one ldmatrix on distinct banks):
//   - A from a [rows][k] tile (Q, K, V, dO):      non-trans;
//   - B = Mᵀ from a [n][k] tile (K for QKᵀ):      non-trans;
//   - B = M  from a [k][n] tile (V for PV):       .trans.
// Two C tiles side by side (n = 0..7, 8..15) are exactly one A operand over
// k = 16, which chains QKᵀ into PV without a round trip through memory.

#include "gpu/kernels/dflash_attention.hpp"
#include "gpu/kernels/wgmma.cuh"

#include <algorithm>
#include <climits>
#include <type_traits>

#include <cuda_bf16.h>
#include <cuda_fp16.h>

namespace tandem::gpu::kernels {
namespace {

constexpr int rows_per_block = 16;  // Bs: one block is one 16-row query tile
constexpr float log2e = 1.4426950408889634f;
constexpr float ln2 = 0.6931471805599453f;
constexpr unsigned full_mask = 0xffffffffu;

// ---- PTX wrappers --------------------------------------------------------

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

/// 16-byte global → shared copy; writes zeros (reads nothing) when !valid.
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
               "r"(valid ? 16 : 0)
               : "memory");
}

__device__ __forceinline__ void cp_async_commit() {
  asm volatile("cp.async.commit_group;\n" ::: "memory");
}

template <int pending>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(pending) : "memory");
}

__device__ __forceinline__ void ldsm_x4(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

__device__ __forceinline__ void ldsm_x4_t(uint32_t (&r)[4], uint32_t addr) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(addr)
               : "memory");
}

/// 2^x; exactly +0 for −inf.
__device__ __forceinline__ float exp2_approx(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}

__device__ __forceinline__ float quad_max(float x) {
  x = fmaxf(x, __shfl_xor_sync(full_mask, x, 1));
  return fmaxf(x, __shfl_xor_sync(full_mask, x, 2));
}

__device__ __forceinline__ float quad_sum(float x) {
  x += __shfl_xor_sync(full_mask, x, 1);
  return x + __shfl_xor_sync(full_mask, x, 2);
}

/// Element type: packing, widening, and the matching mma.
template <typename T>
struct elem;

template <>
struct elem<__nv_bfloat16> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float widen(uint16_t x) {
    return __uint_as_float(static_cast<uint32_t>(x) << 16);
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

template <>
struct elem<__half> {
  static __device__ __forceinline__ uint32_t pack(float lo, float hi) {
    __half2 v = __floats2half2_rn(lo, hi);
    return *reinterpret_cast<uint32_t*>(&v);
  }
  static __device__ __forceinline__ float widen(uint16_t x) {
    return __half2float(__ushort_as_half(x));
  }
  static __device__ __forceinline__ void mma(float (&c)[4], const uint32_t (&a)[4], uint32_t b0,
                                             uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
};

// ---- addressing ----------------------------------------------------------

__device__ __forceinline__ const uint16_t* at_row(const attn_in& t, int b, int h, int64_t row) {
  return static_cast<const uint16_t*>(t.data) + b * t.batch + h * t.head + row * t.token;
}

__device__ __forceinline__ uint16_t* at_row(const attn_out& t, int b, int h, int64_t row) {
  return static_cast<uint16_t*>(t.data) + b * t.batch + h * t.head + row * t.token;
}

/// Lane address offsets (elements) inside a row-major tile of pitch RS.
template <int RS>
struct lane_offsets {
  int a;  ///< A operand (16 rows × 16 k) at (0, 0): add 16·ks
  int bn; ///< non-trans B pair: 8 n-rows × 32 k at (0, 0): add 32·kp (+ 8n·RS)
  int bt; ///< .trans B pair: 16 k-rows × 16 n at (0, 0): add 16·np
  int bq; ///< non-trans B pair for two n-tiles: 16 n-rows × 16 k at (0, 0): add 16·ks
  __device__ __forceinline__ explicit lane_offsets(int lane)
      : a((lane & 15) * RS + (lane >> 4) * 8),
        bn((lane & 7) * RS + (lane >> 3) * 8),
        bt(((lane & 7) + ((lane >> 3) & 1) * 8) * RS + (lane >> 4) * 8),
        bq(((lane & 7) + (lane >> 4) * 8) * RS + ((lane >> 3) & 1) * 8) {}
};

/// Visibility of block jj in row b: [lo, hi) clipped to [0, S); empty when
/// keep is 0.
struct block_range {
  int lo = 0, hi = 0;
  bool keep = false;
};

__device__ __forceinline__ block_range range_of(const dflash_ranges& r, int64_t row_base, int jj,
                                                int s_len) {
  block_range out;
  out.keep = r.keep[row_base + jj] != 0;
  if (out.keep) {
    out.lo = max(r.ctx_lo[row_base + jj], 0);
    out.hi = min(r.ctx_hi[row_base + jj], s_len);
    if (out.hi < out.lo)
      out.hi = out.lo;
  }
  return out;
}

/// Copies `count` rows (16-byte chunks of d) of a [T, d] slice starting at
/// `src` (row stride `stride`) into a warp's shared tile of pitch RS.
template <int D, int RS>
__device__ __forceinline__ void warp_load_rows(uint16_t* dst, const uint16_t* src, int64_t stride,
                                               int count, int lane) {
  constexpr int chunks = D / 8;
  for (int i = lane; i < count * chunks; i += 32) {
    const int r = i / chunks, c = i % chunks;
    cp_async16(smem_addr(dst + r * RS + c * 8), src + r * stride + c * 8, true);
  }
}

/// warp_load_rows for 16 rows of which the first `valid` are read and the
/// rest zero-filled (no global read past them).
template <int D, int RS>
__device__ __forceinline__ void warp_load_rows16(uint16_t* dst, const uint16_t* src,
                                                 int64_t stride, int valid, int lane) {
  constexpr int chunks = D / 8;
  for (int i = lane; i < 16 * chunks; i += 32) {
    const int r = i / chunks, c = i % chunks;
    const bool ok = r < valid;
    cp_async16(smem_addr(dst + r * RS + c * 8), src + (ok ? r : 0) * stride + c * 8, ok);
  }
}

/// The CTA's share of query tiles: warp w takes pair p = blockIdx.x·W + w
/// of the kv head's (block, head-in-group) pairs, p = j·G + hh.
struct query_tile {
  int j = 0;       ///< block of this warp (may be >= N in the last CTA)
  int head = 0;    ///< q head of this warp
  int hh = 0;      ///< index within the GQA group
  int j0 = 0;      ///< first block of the CTA
  int j_end = 0;   ///< one past its last (clipped to N)
  block_range range;
  bool live = false;  ///< j < N and keep
  int u_lo = 0, u_hi = 0;  ///< union of the CTA's context ranges
};

template <int W>
__device__ __forceinline__ query_tile tile_of(const dflash_attention_shape& sh,
                                              const dflash_ranges& ranges, int b, int kvh,
                                              int warp, int cta) {
  query_tile t;
  const int group = sh.heads / sh.kv_heads;
  const int pair = cta * W + warp;
  t.j = pair / group;
  t.hh = pair % group;
  t.head = kvh * group + t.hh;
  t.j0 = cta * (W / group);
  t.j_end = min(t.j0 + W / group, sh.blocks);
  const int64_t rb = int64_t{b} * sh.blocks;
  if (t.j < sh.blocks) {
    t.range = range_of(ranges, rb, t.j, sh.ctx_len);
    t.live = t.range.keep;
  }
  int lo = INT_MAX, hi = 0;
  for (int jj = t.j0; jj < t.j_end; ++jj) {
    const auto r = range_of(ranges, rb, jj, sh.ctx_len);
    if (r.lo < r.hi) {
      lo = min(lo, r.lo);
      hi = max(hi, r.hi);
    }
  }
  t.u_lo = hi > 0 ? lo : 0;
  t.u_hi = hi > 0 ? hi : 0;
  return t;
}

/// Loads context tile `start` .. start+BN (rows past `end` zero-filled) of K
/// and V into shared buffers, all threads of the CTA.
template <int D, int RS, int BN, int NTHREADS>
__device__ __forceinline__ void load_kv_tile(uint16_t* k_dst, uint16_t* v_dst,
                                             const uint16_t* k_src, const uint16_t* v_src,
                                             int64_t k_stride, int64_t v_stride, int start, int end,
                                             int tid) {
  constexpr int chunks = D / 8;
  for (int i = tid; i < BN * chunks; i += NTHREADS) {
    const int r = i / chunks, c = i % chunks;
    const bool ok = start + r < end;
    const int64_t row = ok ? start + r : 0;
    cp_async16(smem_addr(k_dst + r * RS + c * 8), k_src + row * k_stride + c * 8, ok);
    cp_async16(smem_addr(v_dst + r * RS + c * 8), v_src + row * v_stride + c * 8, ok);
  }
  cp_async_commit();
}

// ---- warp-level tile products ---------------------------------------------

/// c (16 × 8·NT, fp32 C fragments) += A·Mᵀ: A = `a`, a 16 × D operand in
/// registers; M the [8·NT][D] row-major tile at shared address `m` (pitch
/// D + 8).  Masked: n-tiles wholly outside keys [vlo, vhi) are skipped.
template <bool Masked, typename T, int D, int NT>
__device__ __forceinline__ void mma_a_mt(float (&c)[NT][4], const uint32_t (&a)[D / 16][4],
                                         uint32_t m, const lane_offsets<D + 8>& off, int vlo,
                                         int vhi) {
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    if (!Masked || (nt * 8 < vhi && nt * 8 + 8 > vlo)) {
#pragma unroll
      for (int kp = 0; kp < D / 32; ++kp) {
        uint32_t r[4];
        ldsm_x4(r, m + 2 * (8 * nt * (D + 8) + off.bn + 32 * kp));
        elem<T>::mma(c[nt], a[2 * kp], r[0], r[1]);
        elem<T>::mma(c[nt], a[2 * kp + 1], r[2], r[3]);
      }
    }
  }
}

/// A operand kq (16 × 16, rounded to T) of C fragments: tiles 2kq and
/// 2kq + 1 side by side.  A wgmma m64nN accumulator is, per warp, the same
/// fragments (float[N / 8][4]).
template <typename T, int NT>
__device__ __forceinline__ void a_of(const float (&c)[NT][4], int kq, uint32_t (&a)[4]) {
  using E = elem<T>;
  a[0] = E::pack(c[2 * kq][0], c[2 * kq][1]);
  a[1] = E::pack(c[2 * kq][2], c[2 * kq][3]);
  a[2] = E::pack(c[2 * kq + 1][0], c[2 * kq + 1][1]);
  a[3] = E::pack(c[2 * kq + 1][2], c[2 * kq + 1][3]);
}

/// acc (16 × D) += C·M: C = `c` (16 × 8·NT fp32 C fragments, rounded to T:
/// two side by side are one A operand); M the [8·NT][D] row-major tile at
/// shared address `m`.  Masked: 16-key steps wholly outside [vlo, vhi) are
/// skipped.
template <bool Masked, typename T, int D, int NT>
__device__ __forceinline__ void mma_c_m(float (&acc)[D / 8][4], const float (&c)[NT][4],
                                        uint32_t m, const lane_offsets<D + 8>& off, int vlo,
                                        int vhi) {
  using E = elem<T>;
#pragma unroll
  for (int kk = 0; kk < NT / 2; ++kk) {
    if (!Masked || (kk * 16 < vhi && kk * 16 + 16 > vlo)) {
      uint32_t ca[4];
      a_of<T>(c, kk, ca);
#pragma unroll
      for (int np = 0; np < D / 16; ++np) {
        uint32_t r[4];
        ldsm_x4_t(r, m + 2 * (16 * kk * (D + 8) + off.bt + 16 * np));
        E::mma(acc[2 * np], ca, r[0], r[1]);
        E::mma(acc[2 * np + 1], ca, r[2], r[3]);
      }
    }
  }
}

/// acc (a warpgroup's 64 × 128 fp32 accumulator) += C·M, issued and
/// committed (the caller waits): C = 64 × 64 fp32 C fragments (per warp
/// float[8][4]), rounded to T as register A operands; M the 64-row tile at
/// shared address `m`, its rows 128-byte swizzled (wg::desc_n).
template <typename T>
__device__ __forceinline__ void wg_acc_c_m(float (&acc)[64], const float (&c)[32], uint32_t m) {
  uint32_t a[4][4];
#pragma unroll
  for (int kq = 0; kq < 4; ++kq)
    a_of<T>(reinterpret_cast<const float (&)[8][4]>(c), kq, a[kq]);
  wg::fence();
#pragma unroll
  for (int kq = 0; kq < 4; ++kq)
    wg::mma_rs_n128_tb<std::is_same_v<T, __nv_bfloat16>>(acc, a[kq], wg::desc_n(m, 64, kq), 1);
  wg::commit();
}

/// mbarrier primitives (sm_90), shared::cta scope.
__device__ __forceinline__ void mbar_init(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(smem_addr(bar)), "r"(count)
               : "memory");
}

__device__ __forceinline__ void mbar_arrive(uint64_t* bar) {
  asm volatile("{\n.reg .b64 st;\nmbarrier.arrive.shared::cta.b64 st, [%0];\n}\n" ::"r"(
                 smem_addr(bar))
               : "memory");
}

/// Waits until the phase of parity `parity` has completed.
__device__ __forceinline__ void mbar_wait(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  do {
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
                 "selp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(smem_addr(bar)), "r"(parity)
                 : "memory");
  } while (!done);
}

/// Copies context keys start .. start + 64 of K and V (rows past `end`
/// zero-filled, nothing read for them) into the [K, V] tiles ([64][128],
/// 128-byte swizzled) of the stage at shared address `stage`, all W·32
/// threads of the CTA (thread: chunk c of rows tid / 16, + 2W, …); one
/// cp.async group.  The wgmma context loops' copy.
template <int W>
__device__ __forceinline__ void wg_load_kv_tile(uint32_t stage, const uint16_t* kc,
                                                const uint16_t* vc, int64_t k_stride,
                                                int64_t v_stride, int start, int end, int tid) {
  constexpr int BN = 64, TILE = BN * 128 * 2;
  const int c = (tid & 15) * 8;
  for (int r = tid >> 4; r < BN; r += W * 2) {
    const bool ok = start + r < end;
    const int64_t row = ok ? start + r : 0;
    const uint32_t dst = stage + wg::sw128(BN, r, c);
    cp_async16(dst, kc + row * k_stride + c, ok);
    cp_async16(dst + TILE, vc + row * v_stride + c, ok);
  }
  cp_async_commit();
}

// ---- forward -------------------------------------------------------------

/// One context tile of a warp's online softmax: S = Q·Kᵀ over the tile's
/// keys [vlo, vhi), then m, l and O updated (m in the exp2 domain: raw
/// score · scale · log2e).  !Masked: the whole tile is visible, so no key
/// is tested (the common case: only the ends of a range are partial).
template <bool Masked, typename T, int D, int BN>
__device__ __forceinline__ void fwd_tile(const uint32_t (&qf)[D / 16][4], uint32_t kb, uint32_t vb,
                                         const lane_offsets<D + 8>& off, int t4, int vlo, int vhi,
                                         float sl2, float (&o)[D / 8][4], float& m0, float& m1,
                                         float& l0, float& l1) {
  constexpr int NT = BN / 8, DT = D / 8;
  float s[NT][4] = {};
  mma_a_mt<Masked, T, D>(s, qf, kb, off, vlo, vhi);
  // The scale is positive, so the max of the raw scores, scaled, is the
  // max of the scaled ones; each exponent is then one fma.
  float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      if (Masked) {
        const int key = nt * 8 + 2 * t4 + e;
        const bool ok = key >= vlo && key < vhi;
        s[nt][e] = ok ? s[nt][e] : -INFINITY;
        s[nt][2 + e] = ok ? s[nt][2 + e] : -INFINITY;
      }
      mx0 = fmaxf(mx0, s[nt][e]);
      mx1 = fmaxf(mx1, s[nt][2 + e]);
    }
  const float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
  const float al0 = exp2_approx(m0 - mn0), al1 = exp2_approx(m1 - mn1);
  m0 = mn0;
  m1 = mn1;
  float rs0 = 0, rs1 = 0;
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    s[nt][0] = exp2_approx(fmaf(s[nt][0], sl2, -mn0));
    s[nt][1] = exp2_approx(fmaf(s[nt][1], sl2, -mn0));
    s[nt][2] = exp2_approx(fmaf(s[nt][2], sl2, -mn1));
    s[nt][3] = exp2_approx(fmaf(s[nt][3], sl2, -mn1));
    rs0 += s[nt][0] + s[nt][1];
    rs1 += s[nt][2] + s[nt][3];
  }
  l0 = l0 * al0 + rs0;
  l1 = l1 * al1 + rs1;
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    o[dt][0] *= al0; o[dt][1] *= al0; o[dt][2] *= al1; o[dt][3] *= al1;
  }
  mma_c_m<Masked, T, D>(o, s, vb, off, vlo, vhi);
}

/// Pipeline stages of the forward's context loop with stage barriers (MB).
constexpr int fwd_wg_stages = 4;

/// The forward's shared memory: the warps' phase-0 slots (Q and the own
/// block's K, then V: 32 rows each), reused by the context pipeline — two
/// stages of K/V (Wg 1: 1024 bytes of alignment slack; mma.sync: pitch
/// D + 8), or fwd_wg_stages with stage barriers (Wg 2).
__host__ __device__ constexpr int fwd_smem_bytes(int d, int warps, int bn, int wg) {
  const int slots = 2 * (d + 8) * 32 * warps;
  const int pipe = wg == 2 ? 1024 + fwd_wg_stages * 2 * bn * d * 2 : 2 * (d + 8) * 4 * bn;
  return slots > pipe ? slots : pipe;
}
static_assert(fwd_smem_bytes(128, 4, 64, 1) >= 1024 + 2 * 2 * 64 * 128 * 2,
              "the unstaged wgmma forward's two stages fit the mma.sync layout's bytes");

/// The context part of the forward with wgmma (sm_90a, d = 128, G a multiple
/// of 4): each warpgroup is 4 heads of one block (warp w = head rows 16w..,
/// so the warp's Q fragments are the A operand as loaded), over 64-key tiles
/// of the CTA's union: S = Q·Kᵀ, the online softmax as in fwd_tile,
/// O += P·V.  The warp's o fragments are the accumulator's.
///
/// Without MB: two stages and a CTA barrier a tile (one warpgroup a CTA,
/// three CTAs an SM).  With MB (several warpgroups — blocks, or the halves of
/// a group of 8 — sharing each K/V tile): fwd_wg_stages stages, each with a
/// full and an empty mbarrier as in dkv_wg_body, so that the warpgroups need
/// not wait for each other every tile (they stay within about a tile of each
/// other); a thread refills a stage at the end of its tile, once every
/// thread is done with the tile that used it last.
template <typename T, int W, bool MB>
__device__ __forceinline__ void fwd_ctx_wg(const dflash_attention_fwd_args& a, const query_tile& qt,
                                           int b, int kvh, uint16_t* smem_raw,
                                           const uint32_t (&qf)[8][4], float sl2,
                                           float (&o)[16][4], float& m0, float& m1, float& l0,
                                           float& l1) {
#if defined(TANDEM_HAS_WGMMA)
  constexpr int D = 128, BN = 64, TILE = BN * D * 2;
  constexpr int NS = MB ? fwd_wg_stages : 2, AHEAD = NS - 1;
  static_assert(!MB || NS >= 3, "stage barriers announce the next tile early");
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024u - (raw & 1023u)) & 1023u);  // [NS stages][K, V][TILE]
  const int tid = threadIdx.x, lane = tid & 31, t4 = lane & 3;
  const int tiles = (qt.u_hi - qt.u_lo + BN - 1) / BN;
  const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
  const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
  __shared__ alignas(8) uint64_t full_b[NS], empty_b[NS];  // MB
  auto load = [&](int t, int buf) {
    if (t >= tiles) {
      cp_async_commit();  // an empty group keeps the count per tile
      return;
    }
    wg_load_kv_tile<W>(base + buf * 2 * TILE, kc, vc, a.k_ctx.token, a.v_ctx.token,
                       qt.u_lo + t * BN, qt.u_hi, tid);
  };
  float (&acc)[64] = reinterpret_cast<float (&)[64]>(o);
  // One tile for this warpgroup's block: keys [vlo, vhi) of it are visible.
  auto compute = [&](uint32_t kb, int vlo, int vhi) {
    const uint32_t vb = kb + TILE;
    float s[32];
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wg::mma_rs_n64<bf>(s, qf[ks], wg::desc_k(kb, BN, ks), ks);
    wg::commit();
    wg::wait<0>();
    const bool full = vlo == 0 && vhi == BN;
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        if (!full) {
          const int key = 8 * i + 2 * t4 + e;
          const bool ok = key >= vlo && key < vhi;
          s[4 * i + e] = ok ? s[4 * i + e] : -INFINITY;
          s[4 * i + 2 + e] = ok ? s[4 * i + 2 + e] : -INFINITY;
        }
        mx0 = fmaxf(mx0, s[4 * i + e]);
        mx1 = fmaxf(mx1, s[4 * i + 2 + e]);
      }
    const float mn0 = fmaxf(m0, quad_max(mx0) * sl2), mn1 = fmaxf(m1, quad_max(mx1) * sl2);
    const float al0 = exp2_approx(m0 - mn0), al1 = exp2_approx(m1 - mn1);
    m0 = mn0;
    m1 = mn1;
    float rs0 = 0, rs1 = 0;
#pragma unroll
    for (int i = 0; i < BN / 8; ++i) {
      s[4 * i + 0] = exp2_approx(fmaf(s[4 * i + 0], sl2, -mn0));
      s[4 * i + 1] = exp2_approx(fmaf(s[4 * i + 1], sl2, -mn0));
      s[4 * i + 2] = exp2_approx(fmaf(s[4 * i + 2], sl2, -mn1));
      s[4 * i + 3] = exp2_approx(fmaf(s[4 * i + 3], sl2, -mn1));
      rs0 += s[4 * i + 0] + s[4 * i + 1];
      rs1 += s[4 * i + 2] + s[4 * i + 3];
    }
    l0 = l0 * al0 + rs0;
    l1 = l1 * al1 + rs1;
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      acc[4 * i + 0] *= al0; acc[4 * i + 1] *= al0;
      acc[4 * i + 2] *= al1; acc[4 * i + 3] *= al1;
    }
    wg_acc_c_m<T>(acc, s, vb);  // O += P·V
    wg::wait<0>();
  };
  if constexpr (MB) {
    if (tid < NS) {
      mbar_init(&full_b[tid], W * 32);
      mbar_init(&empty_b[tid], W * 32);
    }
    __syncthreads();  // the barriers' initialisation
    // cp.async groups: one per tile (empty past the end), so tile t has
    // landed once at most AHEAD - 1 newer groups are pending.
    for (int i = 0; i < AHEAD; ++i)
      load(i, i);
    cp_async_wait<AHEAD - 1>();
    wg::fence_proxy_async();
    if (tiles > 0)
      mbar_arrive(&full_b[0]);
    for (int t = 0; t < tiles; ++t) {
      const int buf = t % NS;
      // Announce tile t + 1, then wait for everyone's copies of tile t.
      if (t + 1 < tiles) {
        cp_async_wait<AHEAD - 2>();
        wg::fence_proxy_async();
        mbar_arrive(&full_b[(t + 1) % NS]);
      }
      mbar_wait(&full_b[buf], static_cast<uint32_t>((t / NS) & 1));
      const int start = qt.u_lo + t * BN;
      const int vlo = max(qt.range.lo - start, 0), vhi = min(qt.range.hi - start, BN);
      if (qt.live && vlo < vhi)  // warpgroup-uniform: one block
        compute(base + buf * 2 * TILE, vlo, vhi);
      mbar_arrive(&empty_b[buf]);
      // Refill the stage tile t - 1 used, once everyone is done with it.
      const int next = t + AHEAD;
      if (next < tiles && next >= NS)
        mbar_wait(&empty_b[next % NS], static_cast<uint32_t>((next / NS - 1) & 1));
      load(next, next % NS);
    }
    cp_async_wait<0>();
  } else {
    if (tiles > 0)
      load(0, 0);
    for (int t = 0; t < tiles; ++t) {
      const int start = qt.u_lo + t * BN;
      if (t + 1 < tiles) {
        load(t + 1, (t + 1) & 1);
        cp_async_wait<1>();
      } else {
        cp_async_wait<0>();
      }
      wg::fence_proxy_async();
      __syncthreads();
      const int vlo = max(qt.range.lo - start, 0), vhi = min(qt.range.hi - start, BN);
      if (qt.live && vlo < vhi)  // warpgroup-uniform: one block
        compute(base + (t & 1) * 2 * TILE, vlo, vhi);
      __syncthreads();
    }
  }
#endif  // fwd_kernel keeps the mma.sync loop where wgmma is not compiled
}

/// 12 / W blocks an SM: 3 of 4 warps (or 1 of 12, or 1 of 8) fit 168 registers a thread
/// (a few bytes spill; docs/bench.md, "Notes from the attention kernel's
/// development").  Wg: 0 mma.sync, 1 wgmma for the context, 2 wgmma with
/// stage barriers (several warpgroups sharing each K/V tile).
template <typename T, int D, int W, int BN, int Wg>
__global__ void __launch_bounds__(W * 32, 12 / W) fwd_kernel(const dflash_attention_fwd_args a) {
  constexpr int RS = D + 8, KS = D / 16, DT = D / 8;
  using E = elem<T>;
  extern __shared__ __align__(16) uint16_t smem[];
  uint16_t* const k_s = smem;                // [2][BN][RS]
  uint16_t* const v_s = smem + 2 * BN * RS;  // [2][BN][RS]; phase 0: [W][32][RS] slots

  const auto& sh = a.shape;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int b = blockIdx.z, kvh = blockIdx.y;
  const auto qt = tile_of<W>(sh, a.ranges, b, kvh, warp, blockIdx.x);
  const float sl2 = sh.scale * log2e;
  const lane_offsets<RS> off(lane);

  float o[DT][4] = {};
  float m0 = -INFINITY, m1 = -INFINITY, l0 = 0, l1 = 0;
  uint32_t qf[KS][4];

  // The block's query rows (chunked mode: a first row and a count).
  const bool chunked = a.row0 != nullptr;
  int64_t row0 = int64_t{qt.j} * rows_per_block;
  int len = rows_per_block;
  if (chunked) {  // a warp past the last block (the last CTA's) writes nothing
    const int64_t at = int64_t{b} * sh.blocks + qt.j;
    row0 = qt.j < sh.blocks ? a.row0[at] : 0;
    len = qt.j < sh.blocks ? a.rows[at] : 0;
  }

  // Phase 0, per warp: Q to registers, then the own block (its first
  // own_keys keys, all 16 unless fewer; chunked: its first len keys, causally).
  uint16_t* const slot = smem + warp * 32 * RS;
  if (qt.live) {
    warp_load_rows16<D, RS>(slot, at_row(a.q, b, qt.head, row0), a.q.token, len, lane);
    warp_load_rows16<D, RS>(slot + 16 * RS, at_row(a.k_blk, b, kvh, row0), a.k_blk.token, len,
                            lane);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    const uint32_t sq = smem_addr(slot);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
      ldsm_x4(qf[ks], sq + 2 * (off.a + 16 * ks));
    float s[2][4] = {};
    mma_a_mt<false, T, D>(s, qf, sq + 2 * 16 * RS, off, 0, 16);
    __syncwarp();
    warp_load_rows16<D, RS>(slot, at_row(a.v_blk, b, kvh, row0), a.v_blk.token, len, lane);
    cp_async_commit();
    if (chunked) {  // key i < len seen by row r iff i <= r (key 0 always: no empty row)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const int key = nt * 8 + 2 * t4 + e;
          s[nt][e] = key < len && key <= g ? s[nt][e] : -INFINITY;
          s[nt][2 + e] = key < len && key <= g + 8 ? s[nt][2 + e] : -INFINITY;
        }
    } else if (sh.own_keys > 0 && sh.own_keys < rows_per_block) {  // key 0 always seen
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          const bool seen = nt * 8 + 2 * t4 + e < sh.own_keys;
          s[nt][e] = seen ? s[nt][e] : -INFINITY;
          s[nt][2 + e] = seen ? s[nt][2 + e] : -INFINITY;
        }
    }
    float mx0 = -INFINITY, mx1 = -INFINITY;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] *= sl2; s[nt][1] *= sl2; s[nt][2] *= sl2; s[nt][3] *= sl2;
      mx0 = fmaxf(mx0, fmaxf(s[nt][0], s[nt][1]));
      mx1 = fmaxf(mx1, fmaxf(s[nt][2], s[nt][3]));
    }
    m0 = quad_max(mx0);
    m1 = quad_max(mx1);
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      s[nt][0] = exp2_approx(s[nt][0] - m0); s[nt][1] = exp2_approx(s[nt][1] - m0);
      s[nt][2] = exp2_approx(s[nt][2] - m1); s[nt][3] = exp2_approx(s[nt][3] - m1);
      l0 += s[nt][0] + s[nt][1];
      l1 += s[nt][2] + s[nt][3];
    }
    cp_async_wait<0>();
    __syncwarp();
    mma_c_m<false, T, D>(o, s, sq, off, 0, 16);
  }
  __syncthreads();  // slots are free: the context pipeline reuses them

  // Context: the union of the CTA's ranges, BN keys a tile, double-buffered.
  if constexpr (Wg != 0 && D == 128 && wg::compiled) {
    fwd_ctx_wg<T, W, Wg == 2>(a, qt, b, kvh, smem, qf, sl2, o, m0, m1, l0, l1);
  } else {
  const int tiles = (qt.u_hi - qt.u_lo + BN - 1) / BN;
  const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
  const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
  if (tiles > 0)
    load_kv_tile<D, RS, BN, W * 32>(k_s, v_s, kc, vc, a.k_ctx.token, a.v_ctx.token, qt.u_lo,
                                    qt.u_hi, tid);
  for (int t = 0; t < tiles; ++t) {
    const int start = qt.u_lo + t * BN;
    if (t + 1 < tiles) {
      const int nb = (t + 1) & 1;
      load_kv_tile<D, RS, BN, W * 32>(k_s + nb * BN * RS, v_s + nb * BN * RS, kc, vc,
                                      a.k_ctx.token, a.v_ctx.token, start + BN, qt.u_hi, tid);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int vlo = max(qt.range.lo - start, 0), vhi = min(qt.range.hi - start, BN);
    if (qt.live && vlo < vhi) {  // warp-uniform
      const uint32_t kb = smem_addr(k_s + (t & 1) * BN * RS);
      const uint32_t vb = smem_addr(v_s + (t & 1) * BN * RS);
      if (vlo == 0 && vhi == BN)
        fwd_tile<false, T, D, BN>(qf, kb, vb, off, t4, vlo, vhi, sl2, o, m0, m1, l0, l1);
      else
        fwd_tile<true, T, D, BN>(qf, kb, vb, off, t4, vlo, vhi, sl2, o, m0, m1, l0, l1);
    }
    __syncthreads();
  }
  }

  if (qt.j >= sh.blocks)
    return;
  l0 = quad_sum(l0);
  l1 = quad_sum(l1);
  const float i0 = qt.live ? 1.0f / l0 : 0.0f, i1 = qt.live ? 1.0f / l1 : 0.0f;
  const bool st0 = g < len, st1 = g + 8 < len;  // chunked: rows past the chunk are not its
  uint16_t* const out0 = at_row(a.out, b, qt.head, row0 + g);
  uint16_t* const out1 = at_row(a.out, b, qt.head, row0 + g + 8);
#pragma unroll
  for (int dt = 0; dt < DT; ++dt) {
    const int col = dt * 8 + 2 * t4;
    if (st0)
      *reinterpret_cast<uint32_t*>(out0 + col) = E::pack(o[dt][0] * i0, o[dt][1] * i0);
    if (st1)
      *reinterpret_cast<uint32_t*>(out1 + col) = E::pack(o[dt][2] * i1, o[dt][3] * i1);
  }
  if (t4 == 0) {
    const int64_t q_len = chunked ? a.q_rows : int64_t{sh.blocks} * rows_per_block;
    float* const lse = a.lse + (int64_t{b} * sh.heads + qt.head) * q_len + row0;
    if (st0)
      lse[g] = qt.live ? (m0 + __log2f(l0)) * ln2 : -INFINITY;
    if (st1)
      lse[g + 8] = qt.live ? (m1 + __log2f(l1)) * ln2 : -INFINITY;
  }
}

// ---- backward: delta = rowsum(dO ∘ O) ------------------------------------

/// 8 lanes a row, 32 rows a CTA; [B, H, Q] rows in order.
template <typename T, int D>
__global__ void __launch_bounds__(256) delta_kernel(const dflash_attention_bwd_args a) {
  using E = elem<T>;
  constexpr int per = D / 8;  // elements per lane: 4, 8 or 16
  const auto& sh = a.shape;
  const int64_t q_len = int64_t{sh.blocks} * rows_per_block;
  const int64_t total = int64_t{sh.batch} * sh.heads * q_len;
  const int64_t row = int64_t{blockIdx.x} * 32 + threadIdx.x / 8;
  const int part = threadIdx.x % 8;
  float acc = 0;
  if (row < total) {
    const int b = static_cast<int>(row / (sh.heads * q_len));
    const int h = static_cast<int>((row / q_len) % sh.heads);
    const int64_t q = row % q_len;
    const uint16_t* o = at_row(a.out, b, h, q) + part * per;
    const uint16_t* d = at_row(a.dout, b, h, q) + part * per;
#pragma unroll
    for (int c = 0; c < per; c += 4) {
      const uint2 ov = *reinterpret_cast<const uint2*>(o + c);
      const uint2 dv = *reinterpret_cast<const uint2*>(d + c);
      const uint16_t* o16 = reinterpret_cast<const uint16_t*>(&ov);
      const uint16_t* d16 = reinterpret_cast<const uint16_t*>(&dv);
#pragma unroll
      for (int e = 0; e < 4; ++e)
        acc = fmaf(E::widen(o16[e]), E::widen(d16[e]), acc);
    }
  }
  acc += __shfl_xor_sync(full_mask, acc, 1);
  acc += __shfl_xor_sync(full_mask, acc, 2);
  acc += __shfl_xor_sync(full_mask, acc, 4);
  if (row < total && part == 0)
    a.delta[row] = acc;
}

// ---- backward, query-major: dQ and the own block's dK/dV -----------------

/// Bytes at the front of the dq role's shared memory: the K/V pipeline,
/// then per-warp 32-row slots for the own block, then the fp32 sums of the
/// own blocks' dK/dV ([blocks of the CTA][2][16][d]).
__host__ __device__ constexpr int dq_region_bytes(int d, int warps, int bn, int group) {
  const int rows = 4 * bn > 32 * warps ? 4 * bn : 32 * warps;
  const int tiles = 2 * (d + 8) * rows;
  const int sums = (warps / group) * 2 * 16 * d * 4;
  const int wg_tiles = d == 128 ? 1024 + 6 * 64 * 128 * 2 : 0;  // dq_ctx_wg's pipeline
  const int most = tiles > sums ? tiles : sums;
  return most > wg_tiles ? most : wg_tiles;
}

__host__ __device__ constexpr int dq_smem_bytes(int d, int warps, int bn, int group) {
  return dq_region_bytes(d, warps, bn, group) + 2 * (d + 8) * 16 * warps * 2
         + warps * 2 * 16 * 24 * 2;
}

/// One context tile of the query-major backward for a warp's 16 rows:
/// recompute S and dP over the tile's keys [vlo, vhi) (all BN when
/// !Masked), dS = P ∘ (dP − delta), dQ += dS·K (unscaled).  lse in the
/// exp2 domain.
template <bool Masked, typename T, int D, int BN>
__device__ __forceinline__ void dq_tile(const uint32_t (&qf)[D / 16][4],
                                        const uint32_t (&dof)[D / 16][4], uint32_t kb, uint32_t vb,
                                        const lane_offsets<D + 8>& off, int t4, int vlo, int vhi,
                                        float sl2, float lse0, float lse1, float dl0, float dl1,
                                        float (&dq)[D / 8][4]) {
  constexpr int NT = BN / 8;
  float s[NT][4] = {}, dp[NT][4] = {};
  mma_a_mt<Masked, T, D>(s, qf, kb, off, vlo, vhi);
  mma_a_mt<Masked, T, D>(dp, dof, vb, off, vlo, vhi);
  // dS = P ∘ (dP − delta), into s.
#pragma unroll
  for (int nt = 0; nt < NT; ++nt)
#pragma unroll
    for (int e = 0; e < 2; ++e) {
      float p0 = exp2_approx(fmaf(s[nt][e], sl2, -lse0));
      float p1 = exp2_approx(fmaf(s[nt][2 + e], sl2, -lse1));
      if (Masked) {
        const int key = nt * 8 + 2 * t4 + e;
        const bool ok = key >= vlo && key < vhi;
        p0 = ok ? p0 : 0.0f;
        p1 = ok ? p1 : 0.0f;
      }
      s[nt][e] = p0 * (dp[nt][e] - dl0);
      s[nt][2 + e] = p1 * (dp[nt][2 + e] - dl1);
    }
  mma_c_m<Masked, T, D>(dq, s, kb, off, vlo, vhi);
}

/// wgmma in the backward roles, bits: 1 key-major, 2 query-major context
/// (d = 128, W = 8, G a multiple of 4, sm_90a); 4: the key-major role with
/// a CTA barrier an item even with two warpgroups (variant bit 9).
enum : int { wg_none = 0, wg_dkv = 1, wg_dq = 2, wg_both = 3, wg_cta = 4 };

/// The context part of the query-major backward with wgmma (sm_90a, d = 128,
/// G a multiple of 4, 8 warps): each warpgroup is 4 heads of one block (64
/// query rows, warp w = head rows 16w.., so its Q and dO fragments are the
/// A operands as loaded), over 64-key tiles of the CTA's union in shared
/// memory (double-buffered): S = Q·Kᵀ, dP = dO·Vᵀ, dS = P ∘ (dP − delta),
/// dQ += dS·K (unscaled).  The warp's dq fragments are the accumulator's.
template <typename T, int W>
__device__ __forceinline__ void dq_ctx_wg(const dflash_attention_bwd_args& a, const query_tile& qt,
                                          int b, int kvh, uint16_t* smem_raw,
                                          const uint32_t (&qf)[8][4], const uint32_t (&dof)[8][4],
                                          float lse0, float lse1, float dl0, float dl1, float sl2,
                                          float (&dq)[16][4]) {
#if defined(TANDEM_HAS_WGMMA)
  constexpr int D = 128, BN = 64, TILE = BN * D * 2;
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  const uint32_t raw = smem_addr(smem_raw);
  const uint32_t base = raw + ((1024u - (raw & 1023u)) & 1023u);  // [3 stages][K, V][TILE]
  const int tid = threadIdx.x, lane = tid & 31, t4 = lane & 3;
  const int tiles = (qt.u_hi - qt.u_lo + BN - 1) / BN;
  const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
  const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
  auto load = [&](int start, int buf) {
    wg_load_kv_tile<W>(base + buf * 2 * TILE, kc, vc, a.k_ctx.token, a.v_ctx.token, start,
                       qt.u_hi, tid);
  };
  float (&acc)[64] = reinterpret_cast<float (&)[64]>(dq);
  // Three stages, two tiles in flight: one barrier a tile (tile t's, after
  // which tile t - 1's stage is free for tile t + 2); the next copy is
  // issued before the tile's wgmmas (docs/bench.md).
  constexpr int NS = 3;
  for (int i = 0; i < 2 && i < tiles; ++i)
    load(qt.u_lo + i * BN, i);
  for (int t = 0; t < tiles; ++t) {
    const int start = qt.u_lo + t * BN;
    if (t + 1 < tiles)
      cp_async_wait<1>();
    else
      cp_async_wait<0>();
    wg::fence_proxy_async();
    __syncthreads();
    if (t + 2 < tiles)
      load(start + 2 * BN, (t + 2) % NS);
    const int vlo = max(qt.range.lo - start, 0), vhi = min(qt.range.hi - start, BN);
    if (qt.live && vlo < vhi) {  // warpgroup-uniform: one block
      const uint32_t kb = base + (t % NS) * 2 * TILE, vb = kb + TILE;
      float s[32], dp[32];
      wg::fence();
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wg::mma_rs_n64<bf>(s, qf[ks], wg::desc_k(kb, BN, ks), ks);
#pragma unroll
      for (int ks = 0; ks < D / 16; ++ks)
        wg::mma_rs_n64<bf>(dp, dof[ks], wg::desc_k(vb, BN, ks), ks);
      wg::commit();
      wg::wait<0>();
      const bool full = vlo == 0 && vhi == BN;
#pragma unroll
      for (int i = 0; i < BN / 8; ++i)
#pragma unroll
        for (int e = 0; e < 2; ++e) {
          float p0 = exp2_approx(fmaf(s[4 * i + e], sl2, -lse0));
          float p1 = exp2_approx(fmaf(s[4 * i + 2 + e], sl2, -lse1));
          if (!full) {
            const int key = 8 * i + 2 * t4 + e;
            const bool ok = key >= vlo && key < vhi;
            p0 = ok ? p0 : 0.0f;
            p1 = ok ? p1 : 0.0f;
          }
          s[4 * i + e] = p0 * (dp[4 * i + e] - dl0);
          s[4 * i + 2 + e] = p1 * (dp[4 * i + 2 + e] - dl1);
        }
      wg_acc_c_m<T>(acc, s, kb);  // dQ += dS·K
      wg::wait<0>();
    }
  }
  __syncthreads();  // the last stage read everywhere before the caller reuses the memory
#endif  // dq_body keeps the mma.sync loop where wgmma is not compiled
}

/// One CTA of query tiles (as in the forward): dQ over every visible key,
/// and Σ over the GQA group of the own block's dK/dV in a fixed order.
template <typename T, int D, int W, int BN, int Wg>
__device__ __forceinline__ void dq_body(const dflash_attention_bwd_args& a, int cta, int kvh, int b,
                                        uint16_t* smem) {
  constexpr int RS = D + 8, KS = D / 16, DT = D / 8;
  constexpr int TP = 24;  // pitch of the 16×16 transposition tiles
  using E = elem<T>;
  const auto& sh = a.shape;
  const int group = sh.heads / sh.kv_heads;
  uint16_t* const k_s = smem;                                          // [2][BN][RS]
  uint16_t* const v_s = smem + 2 * BN * RS;                            // [2][BN][RS]
  uint16_t* const q_s = smem + dq_region_bytes(D, W, BN, group) / 2;   // [W][16][RS]
  uint16_t* const do_s = q_s + W * 16 * RS;                            // [W][16][RS]
  uint16_t* const tr_s = do_s + W * 16 * RS;                           // [W][2][16][TP]
  float* const red_s = reinterpret_cast<float*>(smem);  // after the loop: [blocks][2][16][D]

  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const auto qt = tile_of<W>(sh, a.ranges, b, kvh, warp, cta);
  const float sl2 = sh.scale * log2e;
  const lane_offsets<RS> off(lane);
  const int64_t q_len = int64_t{sh.blocks} * rows_per_block;
  const int64_t row0 = int64_t{qt.j} * rows_per_block;

  uint16_t* const qw = q_s + warp * 16 * RS;
  uint16_t* const dow = do_s + warp * 16 * RS;
  uint32_t qf[KS][4], dof[KS][4];
  float lse0 = 0, lse1 = 0, dl0 = 0, dl1 = 0;
  if (qt.j < sh.blocks) {
    warp_load_rows<D, RS>(qw, at_row(a.q, b, qt.head, row0), a.q.token, 16, lane);
    warp_load_rows<D, RS>(dow, at_row(a.dout, b, qt.head, row0), a.dout.token, 16, lane);
    cp_async_commit();
    if (qt.live) {
      const int64_t at = (int64_t{b} * sh.heads + qt.head) * q_len + row0;
      lse0 = a.lse[at + g] * log2e;
      lse1 = a.lse[at + g + 8] * log2e;
      dl0 = a.delta[at + g];
      dl1 = a.delta[at + g + 8];
    }
    cp_async_wait<0>();
    __syncwarp();
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      ldsm_x4(qf[ks], smem_addr(qw) + 2 * (off.a + 16 * ks));
      ldsm_x4(dof[ks], smem_addr(dow) + 2 * (off.a + 16 * ks));
    }
  }

  float dq[DT][4] = {};
  if constexpr ((Wg & wg_dq) && D == 128 && W % 4 == 0 && wg::compiled) {
    dq_ctx_wg<T, W>(a, qt, b, kvh, smem, qf, dof, lse0, lse1, dl0, dl1, sl2, dq);
  } else {
  const int tiles = (qt.u_hi - qt.u_lo + BN - 1) / BN;
  const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
  const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
  if (tiles > 0)
    load_kv_tile<D, RS, BN, W * 32>(k_s, v_s, kc, vc, a.k_ctx.token, a.v_ctx.token, qt.u_lo,
                                    qt.u_hi, tid);
  for (int t = 0; t < tiles; ++t) {
    const int start = qt.u_lo + t * BN;
    if (t + 1 < tiles) {
      const int nb = (t + 1) & 1;
      load_kv_tile<D, RS, BN, W * 32>(k_s + nb * BN * RS, v_s + nb * BN * RS, kc, vc,
                                      a.k_ctx.token, a.v_ctx.token, start + BN, qt.u_hi, tid);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const int vlo = max(qt.range.lo - start, 0), vhi = min(qt.range.hi - start, BN);
    if (qt.live && vlo < vhi) {  // warp-uniform
      const uint32_t kb = smem_addr(k_s + (t & 1) * BN * RS);
      const uint32_t vb = smem_addr(v_s + (t & 1) * BN * RS);
      if (vlo == 0 && vhi == BN)
        dq_tile<false, T, D, BN>(qf, dof, kb, vb, off, t4, vlo, vhi, sl2, lse0, lse1, dl0, dl1, dq);
      else
        dq_tile<true, T, D, BN>(qf, dof, kb, vb, off, t4, vlo, vhi, sl2, lse0, lse1, dl0, dl1, dq);
    }
    __syncthreads();
  }
  }

  // Own block: 16 keys, the first own_keys visible (all 16 unless fewer).
  // Slot of 32 rows per warp: K then V.
  uint32_t pa[4] = {}, da[4] = {};  // Pᵀ and dSᵀ as A operands (keys × queries)
  if (qt.live) {
    uint16_t* const slot = smem + warp * 32 * RS;
    warp_load_rows<D, RS>(slot, at_row(a.k_blk, b, kvh, row0), a.k_blk.token, 16, lane);
    warp_load_rows<D, RS>(slot + 16 * RS, at_row(a.v_blk, b, kvh, row0), a.v_blk.token, 16, lane);
    cp_async_commit();
    cp_async_wait<0>();
    __syncwarp();
    const uint32_t sk = smem_addr(slot);
    float s[2][4] = {}, dp[2][4] = {};
    mma_a_mt<false, T, D>(s, qf, sk, off, 0, 16);
    mma_a_mt<false, T, D>(dp, dof, sk + 2 * 16 * RS, off, 0, 16);
    uint16_t* const tp = tr_s + warp * 2 * 16 * TP;  // P, then dS: [16 q][TP]
    uint16_t* const tds = tp + 16 * TP;
    const int own = sh.own_keys > 0 ? sh.own_keys : rows_per_block;
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int col = nt * 8 + 2 * t4;
      const bool see0 = col < own, see1 = col + 1 < own;
      const float p0 = see0 ? exp2_approx(s[nt][0] * sl2 - lse0) : 0.f;
      const float p1 = see1 ? exp2_approx(s[nt][1] * sl2 - lse0) : 0.f;
      const float p2 = see0 ? exp2_approx(s[nt][2] * sl2 - lse1) : 0.f;
      const float p3 = see1 ? exp2_approx(s[nt][3] * sl2 - lse1) : 0.f;
      *reinterpret_cast<uint32_t*>(tp + g * TP + col) = E::pack(p0, p1);
      *reinterpret_cast<uint32_t*>(tp + (g + 8) * TP + col) = E::pack(p2, p3);
      s[nt][0] = p0 * (dp[nt][0] - dl0);
      s[nt][1] = p1 * (dp[nt][1] - dl0);
      s[nt][2] = p2 * (dp[nt][2] - dl1);
      s[nt][3] = p3 * (dp[nt][3] - dl1);
      *reinterpret_cast<uint32_t*>(tds + g * TP + col) = E::pack(s[nt][0], s[nt][1]);
      *reinterpret_cast<uint32_t*>(tds + (g + 8) * TP + col) = E::pack(s[nt][2], s[nt][3]);
    }
    mma_c_m<false, T, D>(dq, s, sk, off, 0, 16);
    __syncwarp();
    // Transposed reads: matrix i = (q rows 8·(i >> 1), key cols 8·(i & 1)).
    const int tr_off = ((lane & 7) + (lane >> 4) * 8) * TP + ((lane >> 3) & 1) * 8;
    ldsm_x4_t(pa, smem_addr(tp) + 2 * tr_off);
    ldsm_x4_t(da, smem_addr(tds) + 2 * tr_off);
  }
  if (qt.j < sh.blocks) {
    uint16_t* const d0 = at_row(a.dq, b, qt.head, row0 + g);
    uint16_t* const d1 = at_row(a.dq, b, qt.head, row0 + g + 8);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + 2 * t4;
      *reinterpret_cast<uint32_t*>(d0 + col) = E::pack(dq[dt][0] * sh.scale, dq[dt][1] * sh.scale);
      *reinterpret_cast<uint32_t*>(d1 + col) = E::pack(dq[dt][2] * sh.scale, dq[dt][3] * sh.scale);
    }
  }

  // Own-block dV = Σ_heads Pᵀ dO and dK = Σ_heads dSᵀ Q, heads in a fixed
  // order through fp32 shared memory (deterministic).
  __syncthreads();  // every slot read: the region becomes red_s
  const int jl = qt.j - qt.j0;
  for (int hh = 0; hh < group; ++hh) {
    if (qt.j < sh.blocks && qt.hh == hh) {
#pragma unroll
      for (int which = 0; which < 2; ++which) {  // 0: dV (Pᵀ·dO), 1: dK (dSᵀ·Q)
        float acc[DT][4] = {};
        if (qt.live) {
          const uint32_t src = smem_addr(which == 0 ? dow : qw);
#pragma unroll
          for (int np = 0; np < D / 16; ++np) {
            uint32_t r[4];
            ldsm_x4_t(r, src + 2 * (off.bt + 16 * np));
            E::mma(acc[2 * np], which == 0 ? pa : da, r[0], r[1]);
            E::mma(acc[2 * np + 1], which == 0 ? pa : da, r[2], r[3]);
          }
        }
        float* const dst = red_s + (jl * 2 + which) * 16 * D;
#pragma unroll
        for (int dt = 0; dt < DT; ++dt) {
          const int col = dt * 8 + 2 * t4;
          float2* const r0 = reinterpret_cast<float2*>(dst + g * D + col);
          float2* const r1 = reinterpret_cast<float2*>(dst + (g + 8) * D + col);
          if (hh == 0) {
            *r0 = make_float2(acc[dt][0], acc[dt][1]);
            *r1 = make_float2(acc[dt][2], acc[dt][3]);
          } else {
            const float2 x0 = *r0, x1 = *r1;
            *r0 = make_float2(x0.x + acc[dt][0], x0.y + acc[dt][1]);
            *r1 = make_float2(x1.x + acc[dt][2], x1.y + acc[dt][3]);
          }
        }
      }
    }
    __syncthreads();
  }
  const int blocks_here = qt.j_end - qt.j0;
  for (int i = tid; i < blocks_here * 16 * D / 2; i += W * 32) {
    const int e = 2 * i, bl = e / (16 * D), rem = e % (16 * D), r = rem / D, c = rem % D;
    const int64_t row = int64_t{qt.j0 + bl} * rows_per_block + r;
    const float* const dv = red_s + (bl * 2) * 16 * D + rem;
    const float* const dk = red_s + (bl * 2 + 1) * 16 * D + rem;
    *reinterpret_cast<uint32_t*>(at_row(a.dv_blk, b, kvh, row) + c) = E::pack(dv[0], dv[1]);
    *reinterpret_cast<uint32_t*>(at_row(a.dk_blk, b, kvh, row) + c) =
      E::pack(dk[0] * sh.scale, dk[1] * sh.scale);
  }
}

// ---- backward, key-major: context dK/dV ----------------------------------

/// Heads of one block carried per pipeline stage (at most 4).
__host__ __device__ constexpr int dkv_heads_per_item(int group, bool one) {
  return one ? 1 : (group < 4 ? group : 4);
}

__host__ __device__ constexpr int dkv_smem_bytes(int d, int blocks) {
  return 2 * 4 * 2 * 16 * (d + 8) * 2 + 2 * 4 * 2 * 16 * 4 + 4 * blocks;
}

/// Blocks of row rb whose range meets keys [c0, c1), in order, into list
/// (their count into count); one warp.
__device__ __forceinline__ void list_blocks(const dflash_attention_bwd_args& a, int64_t rb, int c0,
                                            int c1, int lane, int* list, int& count_out) {
  const auto& sh = a.shape;
  int count = 0;
  for (int base = 0; base < sh.blocks; base += 32) {
    const int jj = base + lane;
    bool hit = false;
    if (jj < sh.blocks) {
      const auto r = range_of(a.ranges, rb, jj, sh.ctx_len);
      hit = r.lo < r.hi && r.lo < c1 && r.hi > c0;
    }
    const unsigned m = __ballot_sync(full_mask, hit);
    if (hit)
      list[count + __popc(m & ((1u << lane) - 1))] = jj;
    count += __popc(m);
  }
  if (lane == 0)
    count_out = count;
}

/// One CTA of 16·W context keys (warp = 16 keys, dK/dV in registers): for
/// each block whose range meets them, in order, for each head of the group,
/// recompute Pᵀ and dSᵀ and accumulate dV += Pᵀ dO, dK += dSᵀ Q.
template <typename T, int D, int W>
__device__ __forceinline__ void dkv_body(const dflash_attention_bwd_args& a, int tile, int kvh,
                                         int b, uint16_t* smem, int hc) {
  constexpr int RS = D + 8, KS = D / 16, DT = D / 8;
  constexpr int stage = 4 * 2 * 16 * RS;  // elements: [4 heads][Q, dO][16][RS]
  using E = elem<T>;
  uint16_t* const qd_s = smem;                                        // [2][stage]
  float* const ld_s = reinterpret_cast<float*>(smem + 2 * stage);     // [2][4][lse, delta][16]
  int* const list_s = reinterpret_cast<int*>(ld_s + 2 * 4 * 2 * 16);  // [N]
  __shared__ int count_s;

  const auto& sh = a.shape;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int group = sh.heads / sh.kv_heads;
  const int parts = group / hc;
  const int c0 = tile * W * 16, c1 = min(c0 + W * 16, sh.ctx_len);
  const int64_t rb = int64_t{b} * sh.blocks;
  const int64_t q_len = int64_t{sh.blocks} * rows_per_block;
  const float sl2 = sh.scale * log2e;
  const lane_offsets<RS> off(lane);

  if (warp == 0)
    list_blocks(a, rb, c0, c1, lane, list_s, count_s);

  // This warp's 16 keys as A operands, straight from global (zero past S).
  const int key0 = c0 + warp * 16;
  uint32_t kf[KS][4], vf[KS][4];
  {
    const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
    const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
#pragma unroll
    for (int ks = 0; ks < KS; ++ks)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int row = key0 + g + (i & 1) * 8, col = ks * 16 + 2 * t4 + (i >> 1) * 8;
        const bool ok = row < sh.ctx_len;
        kf[ks][i] = ok ? *reinterpret_cast<const uint32_t*>(kc + row * a.k_ctx.token + col) : 0u;
        vf[ks][i] = ok ? *reinterpret_cast<const uint32_t*>(vc + row * a.v_ctx.token + col) : 0u;
      }
  }
  __syncthreads();
  const int items = count_s * parts;

  // Item = (listed block, `hc` consecutive heads of the group).
  auto load_item = [&](int it, int buf) {
    const int jj = list_s[it / parts], head0 = kvh * group + (it % parts) * hc;
    const int64_t row0 = int64_t{jj} * rows_per_block;
    uint16_t* const dst = qd_s + buf * stage;
    constexpr int chunks = D / 8;
    for (int i = tid; i < hc * 2 * 16 * chunks; i += W * 32) {
      const int c = i % chunks, r = (i / chunks) % 16, which = (i / (16 * chunks)) % 2,
                hh = i / (2 * 16 * chunks);
      const uint16_t* src = which == 0 ? at_row(a.q, b, head0 + hh, row0 + r)
                                       : at_row(a.dout, b, head0 + hh, row0 + r);
      cp_async16(smem_addr(dst + ((hh * 2 + which) * 16 + r) * RS + c * 8), src + c * 8, true);
    }
    if (tid < hc * 8) {  // per head: 4 chunks of lse, 4 of delta
      const int hh = tid / 8, which = (tid / 4) % 2, c = tid % 4;
      const int64_t at = (int64_t{b} * sh.heads + head0 + hh) * q_len + row0 + 4 * c;
      const float* src = which == 0 ? a.lse + at : a.delta + at;
      cp_async16(smem_addr(ld_s + buf * 128 + (hh * 2 + which) * 16 + 4 * c), src, true);
    }
    cp_async_commit();
  };

  float dk[DT][4] = {}, dv[DT][4] = {};
  if (items > 0)
    load_item(0, 0);
  for (int it = 0; it < items; ++it) {
    if (it + 1 < items) {
      load_item(it + 1, (it + 1) & 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const auto r = range_of(a.ranges, rb, list_s[it / parts], sh.ctx_len);
    if (key0 < r.hi && key0 + 16 > r.lo) {  // warp-uniform
      const int buf = it & 1;
      const bool ok0 = key0 + g >= r.lo && key0 + g < r.hi;
      const bool ok1 = key0 + g + 8 >= r.lo && key0 + g + 8 < r.hi;
      for (int hh = 0; hh < hc; ++hh) {
        const uint32_t qb = smem_addr(qd_s + buf * stage + hh * 2 * 16 * RS);
        const uint32_t dob = qb + 2 * 16 * RS;
        const float* const lse = ld_s + buf * 128 + hh * 32;
        const float* const del = lse + 16;
        // keys × queries; even and odd k-steps in separate accumulators:
        // twice the independent mma chains to cover the mma latency.
        float st[2][4] = {}, dpt[2][4] = {}, st2[2][4] = {}, dpt2[2][4] = {};
#pragma unroll
        for (int ks = 0; ks < KS; ++ks) {
          uint32_t x[4];
          float (&sa)[2][4] = (ks & 1) ? st2 : st;
          float (&da)[2][4] = (ks & 1) ? dpt2 : dpt;
          ldsm_x4(x, qb + 2 * (off.bq + 16 * ks));
          E::mma(sa[0], kf[ks], x[0], x[1]);
          E::mma(sa[1], kf[ks], x[2], x[3]);
          ldsm_x4(x, dob + 2 * (off.bq + 16 * ks));
          E::mma(da[0], vf[ks], x[0], x[1]);
          E::mma(da[1], vf[ks], x[2], x[3]);
        }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            st[nt][e] += st2[nt][e];
            dpt[nt][e] += dpt2[nt][e];
          }
#pragma unroll
        for (int nt = 0; nt < 2; ++nt)
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int q = nt * 8 + 2 * t4 + e;
            const float l2 = lse[q] * log2e, dl = del[q];
            const float p0 = ok0 ? exp2_approx(st[nt][e] * sl2 - l2) : 0.0f;
            const float p1 = ok1 ? exp2_approx(st[nt][2 + e] * sl2 - l2) : 0.0f;
            st[nt][e] = p0;
            st[nt][2 + e] = p1;
            dpt[nt][e] = p0 * (dpt[nt][e] - dl);
            dpt[nt][2 + e] = p1 * (dpt[nt][2 + e] - dl);
          }
        const uint32_t pa[4] = {E::pack(st[0][0], st[0][1]), E::pack(st[0][2], st[0][3]),
                                E::pack(st[1][0], st[1][1]), E::pack(st[1][2], st[1][3])};
        const uint32_t da[4] = {E::pack(dpt[0][0], dpt[0][1]), E::pack(dpt[0][2], dpt[0][3]),
                                E::pack(dpt[1][0], dpt[1][1]), E::pack(dpt[1][2], dpt[1][3])};
#pragma unroll
        for (int np = 0; np < D / 16; ++np) {
          uint32_t x[4];
          ldsm_x4_t(x, dob + 2 * (off.bt + 16 * np));
          E::mma(dv[2 * np], pa, x[0], x[1]);
          E::mma(dv[2 * np + 1], pa, x[2], x[3]);
          ldsm_x4_t(x, qb + 2 * (off.bt + 16 * np));
          E::mma(dk[2 * np], da, x[0], x[1]);
          E::mma(dk[2 * np + 1], da, x[2], x[3]);
        }
      }
    }
    __syncthreads();
  }

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = key0 + g + 8 * hf;
    if (row >= sh.ctx_len)
      continue;
    uint16_t* const dkr = at_row(a.dk_ctx, b, kvh, row);
    uint16_t* const dvr = at_row(a.dv_ctx, b, kvh, row);
#pragma unroll
    for (int dt = 0; dt < DT; ++dt) {
      const int col = dt * 8 + 2 * t4;
      *reinterpret_cast<uint32_t*>(dkr + col) =
        E::pack(dk[dt][2 * hf] * sh.scale, dk[dt][2 * hf + 1] * sh.scale);
      *reinterpret_cast<uint32_t*>(dvr + col) = E::pack(dv[dt][2 * hf], dv[dt][2 * hf + 1]);
    }
  }
}

// ---- backward, key-major with wgmma (sm_90a, d = 128, G a multiple of 4) ---

/// Pipeline stages of the wgmma key-major role: four with two warpgroups a
/// CTA (one CTA an SM), two with one (variant bit 0), so that two such CTAs
/// fit an SM.
__host__ __device__ constexpr int dkv_wg_stages(int warps) {
  return warps >= 8 ? 4 : 2;
}

/// Its shared memory: 1024 bytes of alignment slack, K and V of each
/// warpgroup, dkv_wg_stages stages of Q and dO (4 heads × 16 rows each) with
/// their lse and delta, the block list.

__host__ __device__ constexpr int dkv_wg_smem_bytes(int warps, int blocks) {
  return 1024 + (warps / 4) * 2 * 16384 + dkv_wg_stages(warps) * 2 * 16384
         + dkv_wg_stages(warps) * 4 * 2 * 16 * 4 + 3 * 4 * blocks;
}

/// Whether the wgmma key-major role's shared memory (its block list grows
/// with the blocks a row) fits an SM: 227 KiB less the kernel's static
/// shared memory (the count and the stage barriers, 80 bytes; 256 kept).
__host__ __device__ constexpr bool dkv_wg_fits(int blocks) {
  return dkv_wg_smem_bytes(8, blocks) <= 227 * 1024 - 256;
}

/// One CTA of 128 context keys, two warpgroups of 64 (dK/dV in registers):
/// for each block whose range meets them, in order, and each group of 4
/// heads of the GQA group (one pipeline stage), the warpgroup computes
/// Sᵀ = K·Qᵀ and dPᵀ = V·dOᵀ (64 keys × 64 queries, both operands in shared
/// memory), Pᵀ and dSᵀ in registers, then dV += Pᵀ·dO and dK += dSᵀ·Q (A from
/// registers, B N-major from the same stage).  dkv_wg_stages(W) stages, all but one
/// holding items in flight (the alternatives measured: docs/bench.md); inside an
/// item, Pᵀ is computed while dPᵀ is still in the tensor cores, and dSᵀ
/// while dV is.  The same blocks, order and roundings
/// as dkv_body, so the same gradients up to the fp32 summation order inside
/// the tensor cores.  Off sm_90a it runs dkv_body.
///
/// Stage barriers (MB, the default with two warpgroups): instead of one CTA
/// barrier an item, two mbarriers a stage, so that the warpgroups need not
/// run in lockstep and one's exponentials overlap the other's matmuls
/// (FlashAttention-3's ping-pong, without a producer warp; 2.37 → 2.31 ms a
/// layer's backward, docs/bench.md).  full[s]: every thread has its copies
/// of the stage's item landed and fenced (it arrives for item it + 1 when it
/// starts item it); empty[s]: every thread's wgmmas on it are done.  A stage
/// is refilled once both warpgroups released it, which keeps them within one
/// item of each other.  Without MB (one warpgroup, two stages: variant bit
/// 0; or variant bit 9), a CTA barrier an item.
template <typename T, int W, bool MB>
__device__ __forceinline__ void dkv_wg_body(const dflash_attention_bwd_args& a, int tile, int kvh,
                                            int b, uint16_t* smem_raw) {
#if defined(TANDEM_HAS_WGMMA)
  static_assert(W % 4 == 0, "whole warpgroups");
  static_assert(!MB || dkv_wg_stages(W) >= 3, "stage barriers announce the next item early");
  constexpr int D = 128, HC = 4, KEYS = 64, TILE = 16384;  // bytes of a [64][128] tile
  constexpr bool bf = std::is_same_v<T, __nv_bfloat16>;
  using E = elem<T>;
  const uint32_t raw = smem_addr(smem_raw);
  unsigned char* const base =
    reinterpret_cast<unsigned char*>(smem_raw) + ((1024u - (raw & 1023u)) & 1023u);
  unsigned char* const kv_s = base;                  // [2 warpgroups][K, V][TILE]
  constexpr int NS = dkv_wg_stages(W), AHEAD = NS - 1;
  unsigned char* const st_s = base + (W / 4) * 2 * TILE;  // [NS][Q, dO][TILE]
  float* const ld_s = reinterpret_cast<float*>(st_s + NS * 2 * TILE);  // [NS][4][lse, delta][16]
  int* const list_s = reinterpret_cast<int*>(ld_s + NS * 4 * 2 * 16);  // [N] blocks,
  int* const lo_s = list_s + a.shape.blocks;  // their context ranges
  int* const hi_s = lo_s + a.shape.blocks;
  __shared__ int count_s;
  __shared__ alignas(8) uint64_t full_b[NS], empty_b[NS];  // MB

  const auto& sh = a.shape;
  const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
  const int wgi = warp >> 2, wi = warp & 3, wtid = tid & 127;
  const int group = sh.heads / sh.kv_heads;
  const int parts = group / HC;
  const int c0 = tile * W * 16, c1 = min(c0 + W * 16, sh.ctx_len);
  const int64_t rb = int64_t{b} * sh.blocks;
  const int64_t q_len = int64_t{sh.blocks} * rows_per_block;
  const float sl2 = sh.scale * log2e;

  if (warp == 0) {
    list_blocks(a, rb, c0, c1, lane, list_s, count_s);
    __syncwarp();
    for (int i = lane; i < count_s; i += 32) {
      const auto r = range_of(a.ranges, rb, list_s[i], sh.ctx_len);
      lo_s[i] = r.lo;
      hi_s[i] = r.hi;
    }
  }
  if constexpr (MB)
    if (tid < NS) {
      mbar_init(&full_b[tid], W * 32);
      mbar_init(&empty_b[tid], W * 32);
    }

  // This warpgroup's 64 keys of K and V (zero past S), once.
  const int wkey0 = c0 + wgi * KEYS;
  unsigned char* const k_s = kv_s + wgi * 2 * TILE;
  unsigned char* const v_s = k_s + TILE;
  {
    const uint16_t* const kc = at_row(a.k_ctx, b, kvh, 0);
    const uint16_t* const vc = at_row(a.v_ctx, b, kvh, 0);
    for (int i = wtid; i < KEYS * (D / 8); i += 128) {
      const int r = i / (D / 8), c = (i % (D / 8)) * 8;
      const bool ok = wkey0 + r < sh.ctx_len;
      const int64_t row = ok ? wkey0 + r : 0;
      const uint32_t off = wg::sw128(KEYS, r, c);
      cp_async16(smem_addr(k_s + off), kc + row * a.k_ctx.token + c, ok);
      cp_async16(smem_addr(v_s + off), vc + row * a.v_ctx.token + c, ok);
    }
    cp_async_commit();
  }
  __syncthreads();  // the block list (and the barriers' initialisation)
  const int items = count_s * parts;

  auto load_item = [&](int it, int buf) {
    if (it >= items) {
      cp_async_commit();  // an empty group keeps the count per item
      return;
    }
    const int jj = list_s[it / parts], head0 = kvh * group + (it % parts) * HC;
    const int64_t row0 = int64_t{jj} * rows_per_block;
    // Thread: 16-byte chunk c of rows qr, qr + W·2, … of each head; head hh
    // sits 16 rows (2048 bytes) after head hh − 1 in the swizzled tile.
    const int c = (tid & 15) * 8;
    const uint32_t q_dst = smem_addr(st_s + buf * 2 * TILE);
    for (int qr = tid >> 4; qr < 16; qr += W * 2) {
      const uint16_t* const q0 = at_row(a.q, b, head0, row0 + qr) + c;
      const uint16_t* const d0 = at_row(a.dout, b, head0, row0 + qr) + c;
      const uint32_t dst = q_dst + wg::sw128(HC * 16, qr, c);
#pragma unroll
      for (int hh = 0; hh < HC; ++hh) {
        cp_async16(dst + hh * 2048, q0 + hh * a.q.head, true);
        cp_async16(dst + TILE + hh * 2048, d0 + hh * a.dout.head, true);
      }
    }
    if (tid < HC * 8) {  // per head: 4 chunks of lse, 4 of delta
      const int hh = tid / 8, which = (tid / 4) % 2, c = tid % 4;
      const int64_t at = (int64_t{b} * sh.heads + head0 + hh) * q_len + row0 + 4 * c;
      const float* src = which == 0 ? a.lse + at : a.delta + at;
      cp_async16(smem_addr(ld_s + buf * 128 + (hh * 2 + which) * 16 + 4 * c), src, true);
    }
    cp_async_commit();
  };

  const int krow0 = wkey0 + wi * 16 + g;  // this thread's key rows: krow0, krow0 + 8
  const uint32_t kb = smem_addr(k_s), vb = smem_addr(v_s);
  float dk[64] = {}, dv[64] = {};
  // cp.async groups: K/V, then one per item (empty past the end), so item
  // `it` has landed once at most AHEAD - 1 newer groups are pending.
  for (int i = 0; i < AHEAD; ++i)
    load_item(i, i);
  if constexpr (MB) {
    cp_async_wait<AHEAD - 1>();  // K/V and item 0
    wg::fence_proxy_async();
    __syncthreads();  // everyone's K/V
    if (items > 0)
      mbar_arrive(&full_b[0]);
  }
  for (int it = 0; it < items; ++it) {
    const int buf = it % NS;
    if constexpr (MB) {
      // Announce item it + 1, then wait for everyone's copies of item it.
      if (it + 1 < items) {
        cp_async_wait<AHEAD - 2>();
        wg::fence_proxy_async();
        mbar_arrive(&full_b[(it + 1) % NS]);
      }
      mbar_wait(&full_b[buf], static_cast<uint32_t>((it / NS) & 1));
    } else {
      cp_async_wait<AHEAD - 1>();
      wg::fence_proxy_async();
      __syncthreads();  // item it landed everywhere; item it - 1's stage is free
    }
    const struct { int lo, hi; } r = {lo_s[it / parts], hi_s[it / parts]};
    const uint32_t qb = smem_addr(st_s + buf * 2 * TILE), dob = qb + TILE;
    float st[32], dpt[32];
    if constexpr (MB)  // fresh each item: no copies of the last item's (registers)
#pragma unroll
      for (int i = 0; i < 32; ++i)
        st[i] = dpt[i] = 0.0f;
    wg::fence();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wg::mma_ss_n64<bf>(st, wg::desc_k(kb, KEYS, ks), wg::desc_k(qb, HC * 16, ks), ks);
    wg::commit();
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks)
      wg::mma_ss_n64<bf>(dpt, wg::desc_k(vb, KEYS, ks), wg::desc_k(dob, HC * 16, ks), ks);
    wg::commit();
    // The next copy goes out while the tensor cores work, into the stage
    // item it - 1 used (free since the CTA barrier; with MB, once both
    // warpgroups released it; docs/bench.md).
    const int next = it + AHEAD;
    if constexpr (MB)
      if (next < items && next >= NS)
        mbar_wait(&empty_b[next % NS], static_cast<uint32_t>((next / NS - 1) & 1));
    load_item(next, next % NS);
    const float* const lse = ld_s + buf * 128;
    const bool ok0 = krow0 >= r.lo && krow0 < r.hi;
    const bool ok1 = krow0 + 8 >= r.lo && krow0 + 8 < r.hi;
    // Column n = 8i + 2t4 + e is query row n % 16 of head n / 16.
    wg::wait<1>();  // Sᵀ
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * i + 2 * t4 + e;
        const float l2 = lse[(n >> 4) * 32 + (n & 15)] * log2e;
        st[4 * i + e] = ok0 ? exp2_approx(st[4 * i + e] * sl2 - l2) : 0.0f;
        st[4 * i + 2 + e] = ok1 ? exp2_approx(st[4 * i + 2 + e] * sl2 - l2) : 0.0f;
      }
    wg_acc_c_m<T>(dv, st, dob);  // dV += Pᵀ·dO
    wg::wait<1>();  // dPᵀ (dV may still run)
#pragma unroll
    for (int i = 0; i < 8; ++i)
#pragma unroll
      for (int e = 0; e < 2; ++e) {
        const int n = 8 * i + 2 * t4 + e;
        const float dl = lse[(n >> 4) * 32 + 16 + (n & 15)];
        dpt[4 * i + e] = st[4 * i + e] * (dpt[4 * i + e] - dl);
        dpt[4 * i + 2 + e] = st[4 * i + 2 + e] * (dpt[4 * i + 2 + e] - dl);
      }
    wg_acc_c_m<T>(dk, dpt, qb);  // dK += dSᵀ·Q
    wg::wait<0>();  // the stage and the A operands' registers are free again
    if constexpr (MB)
      mbar_arrive(&empty_b[buf]);
  }
  cp_async_wait<0>();

#pragma unroll
  for (int hf = 0; hf < 2; ++hf) {
    const int row = krow0 + 8 * hf;
    if (row >= sh.ctx_len)
      continue;
    uint16_t* const dkr = at_row(a.dk_ctx, b, kvh, row);
    uint16_t* const dvr = at_row(a.dv_ctx, b, kvh, row);
#pragma unroll
    for (int i = 0; i < D / 8; ++i) {
      const int col = i * 8 + 2 * t4;
      *reinterpret_cast<uint32_t*>(dkr + col) =
        E::pack(dk[4 * i + 2 * hf] * sh.scale, dk[4 * i + 2 * hf + 1] * sh.scale);
      *reinterpret_cast<uint32_t*>(dvr + col) = E::pack(dv[4 * i + 2 * hf], dv[4 * i + 2 * hf + 1]);
    }
  }
#else
  dkv_body<T, 128, W>(a, tile, kvh, b, smem_raw,
                      dkv_heads_per_item(a.shape.heads / a.shape.kv_heads, false));
#endif
}

/// Grid sizes of the two backward roles, per (row, kv head).
struct bwd_grid {
  int dkv_tiles = 0;  ///< ceil(S / 16W)
  int dq_ctas = 0;    ///< ceil(N / (W / G))
  int hc = 0;         ///< heads a key-major pipeline stage (mma.sync role)
};

/// The key-major role: with wgmma (Wg & wg_dkv) or mma.sync.
template <typename T, int D, int W, int Wg>
__device__ __forceinline__ void dkv_role(const dflash_attention_bwd_args& a, int tile, int kvh,
                                         int b, uint16_t* smem, const bwd_grid& grid) {
  if constexpr ((Wg & wg_dkv) && D == 128 && W % 4 == 0)
    dkv_wg_body<T, W, W == 8 && !(Wg & wg_cta)>(a, tile, kvh, b, smem);
  else
    dkv_body<T, D, W>(a, tile, kvh, b, smem, grid.hc);
}

/// Both roles in one launch: first every key-major CTA (the long ones), then
/// the query-major CTAs, which fill the machine behind them (docs/bench.md).

template <typename T, int D, int W, int BN, int Wg>
__global__ void __launch_bounds__(W * 32, 8 / W)
  bwd_fused_kernel(const dflash_attention_bwd_args a, const bwd_grid grid) {
  extern __shared__ __align__(16) uint16_t smem[];
  const int kv = a.shape.kv_heads;
  int id = blockIdx.x;
  const int dkv_ctas = grid.dkv_tiles * kv * a.shape.batch;
  if (id < dkv_ctas) {
    // Tile-fastest, or (variant bit 8) longest first: every (row, kv head)'s
    // tile 0 (the most blocks), then every tile 1, …
    const int rows = kv * a.shape.batch;
    const bool lpt = (a.variant & 256) != 0;
    const int tile = lpt ? id / rows : id % grid.dkv_tiles;
    const int rest = lpt ? id % rows : id / grid.dkv_tiles;
    dkv_role<T, D, W, Wg>(a, tile, rest % kv, rest / kv, smem, grid);
  } else {
    id -= dkv_ctas;
    dq_body<T, D, W, BN, Wg>(a, id % grid.dq_ctas, (id / grid.dq_ctas) % kv,
                             id / grid.dq_ctas / kv, smem);
  }
}

/// The roles as separate launches (benchmark variant).
template <typename T, int D, int W, int BN, int Wg>
__global__ void __launch_bounds__(W * 32, 8 / W) bwd_dq_kernel(const dflash_attention_bwd_args a) {
  extern __shared__ __align__(16) uint16_t smem[];
  dq_body<T, D, W, BN, Wg>(a, blockIdx.x, blockIdx.y, blockIdx.z, smem);
}

template <typename T, int D, int W, int Wg>
__global__ void __launch_bounds__(W * 32, 8 / W)
  bwd_dkv_kernel(const dflash_attention_bwd_args a, const bwd_grid grid) {
  extern __shared__ __align__(16) uint16_t smem[];
  dkv_role<T, D, W, Wg>(a, blockIdx.x, blockIdx.y, blockIdx.z, smem, grid);
}

// ---- host side -----------------------------------------------------------

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

bool in_ok(const attn_in& t) {
  return aligned16(t.data) && t.batch % 8 == 0 && t.head % 8 == 0 && t.token % 8 == 0;
}

bool out_ok(const attn_out& t) {
  return (reinterpret_cast<uintptr_t>(t.data) & 3u) == 0 && t.batch % 2 == 0 && t.head % 2 == 0
         && t.token % 2 == 0;
}

template <typename... Params, typename... Args>
cudaError_t launch(void (*kernel)(Params...), dim3 grid, int threads, size_t smem,
                   cudaStream_t stream, const Args&... args) {
  if (grid.x == 0 || grid.y == 0 || grid.z == 0)
    return cudaSuccess;
  if (auto e = cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                    static_cast<int>(smem));
      e != cudaSuccess)
    return e;
  kernel<<<grid, threads, smem, stream>>>(args...);
  return cudaGetLastError();
}

constexpr int fwd_bn = 64;

/// `variant` bits (benchmarks, tests/gpu/dflash_attention_harness.py; 0 is
/// the tuned default):
///   1  swap the warp counts below (forward 8, backward 4)   bf16, d = 128 only
///      (the forward's: where it is not staged, e.g. with 2048)
///   2  backward roles as separate launches
///   4  one head per key-major pipeline stage
///   8  64-key tiles in the query-major backward             bf16, d = 128 only
///   16, 32 (with 2): skip the key-major / query-major launch (timing only:
///      the gradients are then incomplete)
///   64  mma.sync everywhere where wgmma is the default (d = 128 and G a
///       multiple of 4; off sm_90a the wgmma paths fall back to mma.sync)
///   128 the query-major role with mma.sync, the key-major one with wgmma
///   256 the one-launch backward's key-major CTAs longest first (all tile 0s,
///       then all tile 1s, …) instead of tile-fastest
///   512 the wgmma key-major role with a CTA barrier an item instead of a
///       full and an empty barrier a stage (dkv_wg_body's MB; two warpgroups)
///   1024 taken by the caller (gpu/models/dflash_attention.cpp: a GQA group's
///       repeated form); the kernels ignore it
///   2048 the forward's former wgmma form: one block a CTA (G = 4, three
///       CTAs an SM) and a CTA barrier a tile, instead of the staged form
///       (several warpgroups a CTA sharing each K/V tile; forward_typed)
///   4096 the staged forward with two blocks a CTA at G = 4 (8 warps), not three
/// With wgmma the backward takes 8 warps a CTA, bit 0 4 (G = 4 only).
///
/// Warps per CTA for mma.sync, a multiple of the group size (whole blocks
/// per CTA): 4 in the forward, 8 in the backward at G = 4 (the fastest
/// measured; docs/bench.md).  Variant bit 0 swaps both choices.
int forward_warps(int group, int variant) {
  return (group > 4 || (variant & 1)) ? 8 : 4;
}

int backward_warps(int group, int variant) {
  return (group > 4 || (group > 1 && !(variant & 1))) ? 8 : 4;
}

/// The warp-count and tile variants are compiled for bf16, d = 128 only;
/// every other type and size takes the default configuration.
template <typename T, int D>
constexpr bool has_variants = std::is_same_v<T, __nv_bfloat16> && D == 128;

/// Wg: 0 mma.sync, 1 wgmma for the context, 2 wgmma with stage barriers.
template <typename T, int D, int W>
cudaError_t forward_config(const dflash_attention_fwd_args& a, cudaStream_t stream, int wg) {
  const auto& sh = a.shape;
  const int per_cta = W / (sh.heads / sh.kv_heads);
  const dim3 grid((sh.blocks + per_cta - 1) / per_cta, sh.kv_heads, sh.batch);
  const size_t smem = fwd_smem_bytes(D, W, fwd_bn, wg);
  // The form asked for or an error, never another form: a silent fallback
  // once had an A/B time the mma.sync forward for the former wgmma one
  // (docs/bench.md, fourteenth pass).
  if constexpr (D == 128) {
    if constexpr (W != 4)  // staged: several warpgroups a CTA
      if (wg == 2)
        return launch(fwd_kernel<T, D, W, fwd_bn, 2>, grid, W * 32, smem, stream, a);
    if constexpr (W != 12)
      if (wg == 1)
        return launch(fwd_kernel<T, D, W, fwd_bn, 1>, grid, W * 32, smem, stream, a);
  }
  if constexpr (W != 12)
    if (wg == 0)
      return launch(fwd_kernel<T, D, W, fwd_bn, 0>, grid, W * 32, smem, stream, a);
  return cudaErrorNotSupported;
}

/// Whether a device of compute capability `major` runs this build's sm_90a
/// code (the wgmma forms; the build compiles it in when its architectures
/// name 90a: gpu/CMakeLists.txt).
bool sm90a_code(int device_major) {
#if defined(TANDEM_KERNELS_SM90A)
  return device_major == 9;
#else
  (void)device_major;
  return false;
#endif
}

/// sm90a_code for the current device: the forward's staged form is for
/// wgmma (on another device its 12-warp CTA would run the mma.sync loop,
/// which takes 4-warp CTAs best).
bool sm90a_device() {
  int dev = 0, major = 0;
  return cudaGetDevice(&dev) == cudaSuccess
         && cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess
         && sm90a_code(major);
}

/// The forward's form.  Default with wgmma (d = 128, G 4 or 8): the staged
/// context loop, several warpgroups a CTA sharing each K/V tile — three
/// blocks a CTA at G = 4 (12 warps; bit 4096: two, 8 warps), a G = 8 block's
/// two warpgroups (docs/bench.md, fourteenth pass).  Bit 2048: the former
/// form (one block a CTA, a CTA barrier a tile).
template <typename T, int D>
cudaError_t forward_typed(const dflash_attention_fwd_args& a, cudaStream_t stream) {
  const int group = a.shape.heads / a.shape.kv_heads;
  const int variant = has_variants<T, D> ? a.variant : 0;
  // wgmma for the context (d = 128, G a multiple of 4; variant bit 6: mma.sync)
  const bool wg = D == 128 && group % 4 == 0 && !(a.variant & 64);
  if constexpr (D == 128)
    if (wg && !(variant & 2048) && (group == 4 || group == 8) && sm90a_device())
      return group == 4 && !(variant & 4096) ? forward_config<T, D, 12>(a, stream, 2)
                                             : forward_config<T, D, 8>(a, stream, 2);
  const int w = forward_warps(group, variant);
  return w == 4 ? forward_config<T, D, 4>(a, stream, wg ? 1 : 0)
                : forward_config<T, D, 8>(a, stream, wg ? 1 : 0);
}

/// delta, then both roles in one launch (variant bit 1: separate launches;
/// bits 4 / 5 then skip the key-major / query-major role, for timing).
/// Wg: which roles use wgmma (wg_dkv, wg_dq bits).
template <typename T, int D, int W, int BN, int Wg>
cudaError_t backward_config(const dflash_attention_bwd_args& a, cudaStream_t stream) {
  const auto& sh = a.shape;
  const int group = sh.heads / sh.kv_heads;
  bwd_grid grid;
  grid.dkv_tiles = (sh.ctx_len + 16 * W - 1) / (16 * W);
  grid.dq_ctas = (sh.blocks + W / group - 1) / (W / group);
  grid.hc = dkv_heads_per_item(group, (a.variant & 4) != 0);
  const size_t dq_smem = dq_smem_bytes(D, W, BN, group);
  const size_t dkv_smem =
    (Wg & wg_dkv) ? dkv_wg_smem_bytes(W, sh.blocks) : dkv_smem_bytes(D, sh.blocks);
  const int64_t rows = int64_t{sh.batch} * sh.heads * sh.blocks * rows_per_block;
  if (auto e = launch(delta_kernel<T, D>, dim3(static_cast<unsigned>((rows + 31) / 32)), 256, 0,
                      stream, a);
      e != cudaSuccess)
    return e;
  if (!(a.variant & 2)) {
    const int64_t ctas = (int64_t{grid.dkv_tiles} + grid.dq_ctas) * sh.kv_heads * sh.batch;
    return launch(bwd_fused_kernel<T, D, W, BN, Wg>, dim3(static_cast<unsigned>(ctas)), W * 32,
                  std::max(dq_smem, dkv_smem), stream, a, grid);
  }
  if (!(a.variant & 32)) {
    const dim3 g(grid.dq_ctas, sh.kv_heads, sh.batch);
    if (auto e = launch(bwd_dq_kernel<T, D, W, BN, Wg>, g, W * 32, dq_smem, stream, a);
        e != cudaSuccess)
      return e;
  }
  if (!(a.variant & 16)) {
    const dim3 g(grid.dkv_tiles, sh.kv_heads, sh.batch);
    return launch(bwd_dkv_kernel<T, D, W, Wg>, g, W * 32, dkv_smem, stream, a, grid);
  }
  return cudaSuccess;
}

template <typename T, int D>
cudaError_t backward_typed(const dflash_attention_bwd_args& a, cudaStream_t stream) {
  const int group = a.shape.heads / a.shape.kv_heads;
  if constexpr (D == 128) {
    // wgmma: two warpgroups a CTA (one with variant bit 0 and G = 4: two
    // CTAs an SM; docs/bench.md); variant bit 7 keeps the query-major role on mma.sync.
    // (The key-major role keeps a block list in shared memory: past ~2700
    // blocks a row it no longer fits, and mma.sync takes over.)
    if (group % 4 == 0 && !(a.variant & 64) && dkv_wg_fits(a.shape.blocks)) {
      const bool two = group > 4 || !(a.variant & 1);
      if constexpr (has_variants<T, D>)
        if ((a.variant & 512) && two)
          return backward_config<T, D, 8, 32, wg_both | wg_cta>(a, stream);
      if constexpr (has_variants<T, D>)
        if (a.variant & 128)
          return two ? backward_config<T, D, 8, 32, wg_dkv>(a, stream)
                     : backward_config<T, D, 4, 32, wg_dkv>(a, stream);
      return two ? backward_config<T, D, 8, 32, wg_both>(a, stream)
                 : backward_config<T, D, 4, 32, wg_both>(a, stream);
    }
  }
  if constexpr (has_variants<T, D>) {
    const bool wide = backward_warps(group, a.variant) == 8, long_tiles = (a.variant & 8) != 0;
    if (wide)
      return long_tiles ? backward_config<T, D, 8, 64, wg_none>(a, stream)
                        : backward_config<T, D, 8, 32, wg_none>(a, stream);
    return long_tiles ? backward_config<T, D, 4, 64, wg_none>(a, stream)
                      : backward_config<T, D, 4, 32, wg_none>(a, stream);
  } else {
    return backward_warps(group, 0) == 8 ? backward_config<T, D, 8, 32, wg_none>(a, stream)
                                      : backward_config<T, D, 4, 32, wg_none>(a, stream);
  }
}

/// Calls Run::go<T, D>(args, stream) for the shape's dtype and head_dim.
template <typename Run, typename Args>
cudaError_t dispatch(const Args& a, cudaStream_t stream) {
  const bool bf = a.shape.dtype == attn_dtype::bf16;
  switch (a.shape.head_dim) {
    case 32: return bf ? Run::template go<__nv_bfloat16, 32>(a, stream) : Run::template go<__half, 32>(a, stream);
    case 64: return bf ? Run::template go<__nv_bfloat16, 64>(a, stream) : Run::template go<__half, 64>(a, stream);
    case 128: return bf ? Run::template go<__nv_bfloat16, 128>(a, stream) : Run::template go<__half, 128>(a, stream);
    default: return cudaErrorInvalidValue;
  }
}

struct run_forward {
  template <typename T, int D>
  static cudaError_t go(const dflash_attention_fwd_args& a, cudaStream_t s) { return forward_typed<T, D>(a, s); }
};

struct run_backward {
  template <typename T, int D>
  static cudaError_t go(const dflash_attention_bwd_args& a, cudaStream_t s) { return backward_typed<T, D>(a, s); }
};

} // namespace

const char* dflash_attention_unsupported(const dflash_attention_shape& sh) {
  if (sh.block_size != rows_per_block)
    return "block size is not 16";
  if (sh.own_keys < 0 || sh.own_keys > rows_per_block)
    return "own_keys is not 0 to 16";
  if (sh.head_dim != 32 && sh.head_dim != 64 && sh.head_dim != 128)
    return "head_dim is not 32, 64 or 128";
  if (sh.heads <= 0 || sh.kv_heads <= 0 || sh.heads % sh.kv_heads != 0)
    return "heads is not a multiple of kv_heads";
  const int group = sh.heads / sh.kv_heads;
  if (group != 1 && group != 2 && group != 4 && group != 8)
    return "GQA group is not 1, 2, 4 or 8";
  if (!(sh.scale > 0.0f) || sh.scale == INFINITY)
    return "softmax scale is not a positive finite number";
  if (sh.batch < 0 || sh.blocks < 0 || sh.ctx_len < 0 || sh.kv_heads > 65535 || sh.batch > 65535)
    return "shape out of range";
  return nullptr;
}

bool dflash_attention_uses_wgmma(const dflash_attention_shape& sh, int variant, int device_major) {
  return sm90a_code(device_major) && dflash_attention_unsupported(sh) == nullptr
         && sh.head_dim == 128 && (sh.heads / sh.kv_heads) % 4 == 0 && !(variant & 64)
         && dkv_wg_fits(sh.blocks);
}

cudaError_t dflash_attention_forward(const dflash_attention_fwd_args& a, cudaStream_t stream) {
  if (dflash_attention_unsupported(a.shape) != nullptr || !in_ok(a.q) || !in_ok(a.k_ctx)
      || !in_ok(a.v_ctx) || !in_ok(a.k_blk) || !in_ok(a.v_blk) || !out_ok(a.out))
    return cudaErrorInvalidValue;
  if ((a.row0 == nullptr) != (a.rows == nullptr) || (a.row0 != nullptr && a.q_rows <= 0))
    return cudaErrorInvalidValue;
  return dispatch<run_forward>(a, stream);
}

cudaError_t dflash_attention_backward(const dflash_attention_bwd_args& a, cudaStream_t stream) {
  if (dflash_attention_unsupported(a.shape) != nullptr || !in_ok(a.q) || !in_ok(a.k_ctx)
      || !in_ok(a.v_ctx) || !in_ok(a.k_blk) || !in_ok(a.v_blk) || !in_ok(a.out) || !in_ok(a.dout)
      || !out_ok(a.dq) || !out_ok(a.dk_ctx) || !out_ok(a.dv_ctx) || !out_ok(a.dk_blk)
      || !out_ok(a.dv_blk) || !aligned16(a.lse) || !aligned16(a.delta))
    return cudaErrorInvalidValue;
  return dispatch<run_backward>(a, stream);
}

} // namespace tandem::gpu::kernels
