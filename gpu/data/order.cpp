#include "gpu/data/order.hpp"

#include <numeric>
#include <string>
#include <utility>

#include "gpu/device/error.hpp"

namespace tandem::gpu::data {

namespace {

constexpr uint64_t golden = 0x9e3779b97f4a7c15ULL;

uint64_t mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

uint64_t splitmix64(uint64_t& x) {
  x += golden;
  return mix(x);
}

uint64_t rotl(uint64_t x, int k) {
  return (x << k) | (x >> (64 - k));
}

} // namespace

rng::rng(uint64_t seed) {
  uint64_t x = seed;
  for (auto& s : s_)
    s = splitmix64(x);
}

uint64_t rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

uint64_t rng::below(uint64_t n) {
  // Lemire, "Fast random integer generation in an interval" (2019).
  unsigned __int128 m = static_cast<unsigned __int128>(next()) * n;
  auto low = static_cast<uint64_t>(m);
  if (low < n) {
    const uint64_t threshold = (0 - n) % n;
    while (low < threshold) {
      m = static_cast<unsigned __int128>(next()) * n;
      low = static_cast<uint64_t>(m);
    }
  }
  return static_cast<uint64_t>(m >> 64);
}

std::vector<int64_t> epoch_order(int64_t num_samples, uint64_t seed, int64_t epoch) {
  if (num_samples < 0)
    throw error(errc::bad_input, "epoch_order: num_samples = " + std::to_string(num_samples)
                                     + " is negative");
  std::vector<int64_t> order(static_cast<size_t>(num_samples));
  std::iota(order.begin(), order.end(), int64_t{0});
  rng gen(seed ^ mix(static_cast<uint64_t>(epoch) + golden));
  for (int64_t i = num_samples - 1; i >= 1; --i) {
    const auto j = static_cast<int64_t>(gen.below(static_cast<uint64_t>(i) + 1));
    std::swap(order[static_cast<size_t>(i)], order[static_cast<size_t>(j)]);
  }
  return order;
}

std::vector<int64_t> rank_order(const std::vector<int64_t>& order, int64_t rank, int64_t world) {
  if (world < 1 || rank < 0 || rank >= world)
    throw error(errc::bad_input, "rank_order: rank " + std::to_string(rank) + " of world "
                                     + std::to_string(world) + " (need 0 <= rank < world)");
  std::vector<int64_t> out;
  out.reserve(order.size() / static_cast<size_t>(world) + 1);
  for (size_t p = static_cast<size_t>(rank); p < order.size(); p += static_cast<size_t>(world))
    out.push_back(order[p]);
  return out;
}

} // namespace tandem::gpu::data
