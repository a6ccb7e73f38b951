#pragma once
/// Inference with key/value caches (gpu/ only, torch): the Qwen3 target
/// decoding B rows of different lengths, and the DFlash drafter with its
/// cache of the projected target context (DFLASH.md, "Inference and τ").
/// The same code runs eagerly on the CPU and on CUDA; speculative decoding
/// on top of the two: speculative.hpp.
///
/// On CUDA, a target forward of T ≤ 16 new positions per row (a decode
/// step, a verified block) attends with the split-K decode kernel
/// (gpu/kernels/decode_attention.hpp), which reads the rows' lengths from
/// device memory and covers the whole cache: its shapes never change, so
/// each (T, taps, logit_at) forward is captured once as a CUDA graph and
/// replayed (TANDEM_DECODE=eager in the environment: the kernel without
/// graphs; TANDEM_DECODE=sdpa: SDPA, as on the CPU; for comparisons).  On a
/// target with the fused layout, forwards of one to four rows in all run
/// their projections on the decode GEMV kernel (gpu/kernels/decode_gemv.hpp,
/// the norms and SwiGLU fused in; TANDEM_DECODE_GEMV=0: cuBLAS), and the q/k
/// norm kernel writes the keys and values into the cache.  Longer forwards (a prefill) and the CPU run eagerly with
/// SDPA over the longest row.
///
/// Positions: row b of a decoder holds `length(b)` committed positions
/// 0 … length(b)−1.  A forward writes its T new positions after them
/// (length(b) … length(b)+T−1) without committing them; set_length commits
/// an accepted prefix or crops a rejected tail.  Rows may be padded on the
/// right (a shorter prompt in a batch): what a padded position writes lies
/// past the row's length and is overwritten before it is ever seen.

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "gpu/models/dflash.hpp"
#include "gpu/models/qwen3.hpp"

namespace tandem::gpu {

/// Keys and values of L layers for B rows of up to C positions each.
struct kv_cache {
  std::vector<at::Tensor> k;    ///< L of [B, K, C, h], RoPE applied
  std::vector<at::Tensor> v;    ///< L of [B, K, C, h]
  std::vector<int64_t> length;  ///< B: committed positions per row
};

/// The frozen Qwen3 target with a KV cache: prefill, decode of one token and
/// verification of a block are all `forward` over T new positions per row.
class target_decoder {
public:
  /// Caches for `batch` rows of `capacity` positions (prompt + new tokens +
  /// one block), on the target's device and in its dtype.  The target must
  /// have been loaded with its head (qwen3_target::load(..., with_head)).
  /// `mode` ("" = TANDEM_DECODE, else "graphs"): "graphs", "eager" or
  /// "sdpa", as above.
  target_decoder(const qwen3_target& target, int64_t batch, int64_t capacity, const std::string& mode = "");

  struct output {
    at::Tensor logits;  ///< [B, T, V] float32 (T = 1 with `logit_at`)
    at::Tensor taps;    ///< [B, T, n·D] the tap layers' outputs; undefined unless asked
  };

  /// Runs ids [B, T] at positions length(b) + t: writes their keys/values
  /// into the cache and attends causally (query t of row b sees positions
  /// 0 … length(b)+t).  `logit_at` [B] int64, when defined, keeps only the
  /// logits of position logit_at[b] of each row (a prefill's last token).
  output forward(const at::Tensor& ids, bool want_taps, const at::Tensor& logit_at = {});

  void set_length(int64_t row, int64_t n);
  int64_t length(int64_t row) const { return cache_.length.at(row); }
  int64_t capacity() const { return capacity_; }
  int64_t batch() const { return static_cast<int64_t>(cache_.length.size()); }
  void reset();  ///< every row empty
  const qwen3_target& target() const { return target_; }
  /// Forwards replayed from a captured graph so far (0 on the CPU).
  int64_t replays() const { return replays_; }
  /// Whether forwards of one to four rows use the decode GEMV kernel
  /// (TANDEM_DECODE_GEMV, read at construction).
  bool gemv() const { return gemv_; }
  /// Whether the decode GEMV is launched with programmatic dependent launch
  /// (TANDEM_PDL, checked at construction on CUDA; gpu/kernels/pdl.cuh reads
  /// it at the launch).
  bool pdl() const { return pdl_; }
  /// The decode mode taken at construction (TANDEM_DECODE or the caller's):
  /// "graphs", "eager" or "sdpa"; the CPU always "sdpa".
  const std::string& mode() const { return mode_; }
  ~target_decoder();

private:
  /// The forward itself (eager, or the body a graph captures); `kernel`:
  /// attention through the decode kernel over the whole cache.
  output run(const at::Tensor& ids, bool want_taps, const at::Tensor& logit_at, bool kernel);
  bool kernel_fits(int64_t t) const;

  struct graph;
  const qwen3_target& target_;
  int64_t capacity_;
  kv_cache cache_;
  at::Tensor lengths_dev_;   ///< [B] int64 on the device: cache_.length, for the kernel
  at::Tensor workspace_;     ///< the kernel's fp32 partials, sized for T = 16
  int splits_ = 1;
  bool graphs_ = false;
  std::string mode_ = "sdpa";  ///< mode(); set on CUDA
  bool kernel_ = true;
  bool fused_layout_ = false;  ///< the kernel modes use the target's fused layout (qwen3.hpp)
  bool gemv_ = false;          ///< its projections at ≤ 4 rows on the decode GEMV kernel (CUDA; TANDEM_DECODE_GEMV)
  bool pdl_ = false;           ///< the GEMV launched with PDL (CUDA; TANDEM_PDL)
  std::map<std::tuple<int64_t, bool, bool>, std::unique_ptr<graph>> graphs_by_shape_;
  int64_t replays_ = 0;
};

/// The DFlash drafter in inference: per layer, the keys/values of the fused
/// context H_t = hidden_norm(fc(taps)) of every committed position, extended
/// as positions are committed (never recomputed), and one forward per cycle
/// over the block [last token, MASK × (T−1)] at the positions after them.
class drafter_decoder {
public:
  /// `embed` and `lm_head`: the target's [V, D] (the drafter has none of its own).
  drafter_decoder(const dflash_config& cfg, const dflash_weights& w, at::Tensor embed,
                  at::Tensor lm_head, int64_t batch, int64_t capacity);

  /// Appends the taps [B, P, n·D] of each row's next `count[b]` ≤ P
  /// committed positions to its context.
  void extend_context(const at::Tensor& taps, const std::vector<int64_t>& count);

  /// The block ids [B, T] (T ≤ block size) at positions context_length(b) + t
  /// (bidirectional inside the block, every context position visible):
  /// the draft logits of block positions 1 … T−1, [B, T−1, V] float32.
  /// `shift` (a planted bug for the tests: speculative.hpp) returns those of
  /// positions 0 … T−2 instead.
  at::Tensor draft(const at::Tensor& block_ids, bool shift = false);

  int64_t context_length(int64_t row) const { return cache_.length.at(row); }
  void set_context_length(int64_t row, int64_t n);
  void reset();
  const dflash_config& config() const { return cfg_; }

private:
  const dflash_config& cfg_;
  const dflash_weights& w_;
  at::Tensor embed_, lm_head_;
  int64_t capacity_;
  kv_cache cache_;
};

} // namespace tandem::gpu
