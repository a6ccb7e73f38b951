#pragma once
/// Epoch order and the data cursor (docs/data.md, "Reading").
///
/// Every process computes the same shuffle of all sample ids from (seed,
/// epoch); prefetch rank r of R takes positions r, r+R, r+2R, … of it. The
/// shuffle is defined here bit for bit (below), never by a standard-library
/// distribution, so it is the same on every platform and compiler.
/// Torch-free: the coordinator's ledger may use it.
///
/// The shuffle, exactly:
///   mix(z)       = z ^= z >> 30; z *= 0xbf58476d1ce4e5b9; z ^= z >> 27;
///                  z *= 0x94d049bb133111eb; return z ^ (z >> 31)      (uint64 arithmetic)
///   splitmix64() = x += 0x9e3779b97f4a7c15; return mix(x)
///   x  = seed ^ mix(uint64(epoch) + 0x9e3779b97f4a7c15)
///   s[0..3]      = four splitmix64() draws: the state of xoshiro256**
///   below(n)     = Lemire's unbiased bounded draw: m = next() * n (128-bit);
///                  while low64(m) < (2^64 - n) mod n: redraw; return high64(m)
///   order        = [0, 1, …, N-1]; for i = N-1 down to 1: swap(order[i], order[below(i+1)])
/// tests/unit/data_order_reference.py implements the same in Python.

#include <cstdint>
#include <vector>

namespace tandem::gpu::data {

/// xoshiro256** (Blackman & Vigna), seeded through splitmix64. Small,
/// fast, and fully specified, unlike std::uniform_int_distribution.
class rng {
public:
  explicit rng(uint64_t seed);
  uint64_t next();
  /// Uniform in [0, n), n > 0, unbiased.
  uint64_t below(uint64_t n);

private:
  uint64_t s_[4];
};

/// The shuffle of sample ids 0..num_samples-1 for (seed, epoch).
std::vector<int64_t> epoch_order(int64_t num_samples, uint64_t seed, int64_t epoch);

/// Positions rank, rank+world, rank+2·world, … of `order`: the ranks'
/// orders are disjoint and together hold every entry exactly once.
/// Throws gpu::error(bad_input) unless 0 ≤ rank < world.
std::vector<int64_t> rank_order(const std::vector<int64_t>& order, int64_t rank, int64_t world);

/// Where a rank's packer stands in an epoch. The packer's look-ahead can
/// take a sample before an earlier one that did not fit, so a position alone
/// is not enough to resume exactly: `taken` lists those later positions.
/// Every position < `position` and every one in `taken` is consumed; every
/// other is not. A fresh epoch is {epoch, 0, {}}.
struct cursor {
  int64_t epoch = 0;
  int64_t position = 0;        ///< first position of the rank's order not yet consumed
  std::vector<int64_t> taken;  ///< consumed positions > `position`, ascending

  friend bool operator==(const cursor& a, const cursor& b) {
    return a.epoch == b.epoch && a.position == b.position && a.taken == b.taken;
  }
  friend bool operator!=(const cursor& a, const cursor& b) { return !(a == b); }
};

} // namespace tandem::gpu::data
