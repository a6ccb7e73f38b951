#include "gpu/data/sha256.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

#include <fcntl.h>
#include <unistd.h>

#if defined(__x86_64__)
#include <cpuid.h>
#include <immintrin.h>
#endif

#include "gpu/device/error.hpp"

namespace tandem::gpu::data {

namespace {

constexpr std::array<uint32_t, 8> initial_state = {
  0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19,
};

alignas(16) constexpr uint32_t round_constants[64] = {
  0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
  0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
  0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
  0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
  0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
  0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
  0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
  0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2,
};

inline uint32_t rotr(uint32_t x, int n) {
  return (x >> n) | (x << (32 - n));
}

inline uint32_t load_be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

/// FIPS 180-4 §6.2.2, one 64-byte block at a time.
void compress_portable(uint32_t* state, const uint8_t* blocks, size_t count) {
  uint32_t w[64];
  for (size_t b = 0; b < count; ++b, blocks += 64) {
    for (int i = 0; i < 16; ++i)
      w[i] = load_be32(blocks + 4 * i);
    for (int i = 16; i < 64; ++i) {
      const uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      const uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = state[0], b_ = state[1], c = state[2], d = state[3];
    uint32_t e = state[4], f = state[5], g = state[6], h = state[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t s1 = rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25);
      const uint32_t ch = (e & f) ^ (~e & g);
      const uint32_t t1 = h + s1 + ch + round_constants[i] + w[i];
      const uint32_t s0 = rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22);
      const uint32_t maj = (a & b_) ^ (a & c) ^ (b_ & c);
      const uint32_t t2 = s0 + maj;
      h = g; g = f; f = e; e = d + t1;
      d = c; c = b_; b_ = a; a = t1 + t2;
    }
    state[0] += a; state[1] += b_; state[2] += c; state[3] += d;
    state[4] += e; state[5] += f; state[6] += g; state[7] += h;
  }
}

#if defined(__x86_64__)
bool cpu_has_sha_extensions() {
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d))
    return false;
  const bool ssse3 = (c & (1u << 9)) != 0, sse41 = (c & (1u << 19)) != 0;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d))
    return false;
  const bool sha = (b & (1u << 29)) != 0;
  return ssse3 && sse41 && sha;
}

/// The same compression with the SHA-NI instructions: the state lives as
/// (ABEF, CDGH); each group of four rounds adds K to four schedule words and
/// runs sha256rnds2 twice, while msg1/msg2 extend the schedule four words at
/// a time (Intel's reference arrangement, written as a loop the compiler
/// unrolls).
__attribute__((target("sha,sse4.1,ssse3"))) void compress_shani(uint32_t* state,
                                                                 const uint8_t* blocks,
                                                                 size_t count) {
  const __m128i byte_swap = _mm_set_epi64x(0x0c0d0e0f08090a0bULL, 0x0405060700010203ULL);
  __m128i tmp = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[0]));
  __m128i state1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(&state[4]));
  tmp = _mm_shuffle_epi32(tmp, 0xB1);              // CDAB
  state1 = _mm_shuffle_epi32(state1, 0x1B);        // EFGH
  __m128i state0 = _mm_alignr_epi8(tmp, state1, 8);  // ABEF
  state1 = _mm_blend_epi16(state1, tmp, 0xF0);     // CDGH

  for (size_t b = 0; b < count; ++b, blocks += 64) {
    const __m128i abef_save = state0, cdgh_save = state1;
    __m128i m[4];
#pragma GCC unroll 16
    for (int g = 0; g < 16; ++g) {
      if (g < 4)
        m[g] = _mm_shuffle_epi8(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(blocks + 16 * g)), byte_swap);
      __m128i msg = _mm_add_epi32(
        m[g % 4], _mm_load_si128(reinterpret_cast<const __m128i*>(&round_constants[4 * g])));
      state1 = _mm_sha256rnds2_epu32(state1, state0, msg);
      if (g >= 3 && g <= 14) {
        const __m128i t = _mm_alignr_epi8(m[g % 4], m[(g + 3) % 4], 4);
        m[(g + 1) % 4] = _mm_sha256msg2_epu32(_mm_add_epi32(m[(g + 1) % 4], t), m[g % 4]);
      }
      msg = _mm_shuffle_epi32(msg, 0x0E);
      state0 = _mm_sha256rnds2_epu32(state0, state1, msg);
      if (g >= 1 && g <= 12)
        m[(g + 3) % 4] = _mm_sha256msg1_epu32(m[(g + 3) % 4], m[g % 4]);
    }
    state0 = _mm_add_epi32(state0, abef_save);
    state1 = _mm_add_epi32(state1, cdgh_save);
  }

  tmp = _mm_shuffle_epi32(state0, 0x1B);           // FEBA
  state1 = _mm_shuffle_epi32(state1, 0xB1);        // DCHG
  state0 = _mm_blend_epi16(tmp, state1, 0xF0);     // DCBA
  state1 = _mm_alignr_epi8(state1, tmp, 8);        // HGFE
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[0]), state0);
  _mm_storeu_si128(reinterpret_cast<__m128i*>(&state[4]), state1);
}
#endif

} // namespace

bool sha256::hardware_available() {
#if defined(__x86_64__)
  static const bool has = cpu_has_sha_extensions();
  return has;
#else
  return false;
#endif
}

sha256::sha256(bool allow_hardware)
  : state_(initial_state), hardware_(allow_hardware && hardware_available()) {}

void sha256::compress(const uint8_t* blocks, size_t count) {
#if defined(__x86_64__)
  if (hardware_) {
    compress_shani(state_.data(), blocks, count);
    return;
  }
#endif
  compress_portable(state_.data(), blocks, count);
}

void sha256::update(const void* data, size_t size) {
  const auto* p = static_cast<const uint8_t*>(data);
  total_bytes_ += size;
  if (buffered_ > 0) {
    const size_t take = std::min(size, 64 - buffered_);
    std::memcpy(buffer_.data() + buffered_, p, take);
    buffered_ += take;
    p += take;
    size -= take;
    if (buffered_ < 64)
      return;
    compress(buffer_.data(), 1);
    buffered_ = 0;
  }
  if (size >= 64) {
    compress(p, size / 64);
    p += size / 64 * 64;
    size %= 64;
  }
  std::memcpy(buffer_.data(), p, size);
  buffered_ = size;
}

sha256::digest sha256::finish() {
  // Padding: 0x80, zeros up to 56 mod 64, then the bit length big-endian.
  const uint64_t bits = total_bytes_ * 8;
  uint8_t pad[72] = {0x80};
  const size_t pad_len = (buffered_ < 56 ? 56 : 120) - buffered_;
  for (int i = 0; i < 8; ++i)
    pad[pad_len + i] = static_cast<uint8_t>(bits >> (56 - 8 * i));
  update(pad, pad_len + 8);
  digest out;
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 4; ++j)
      out[4 * i + j] = static_cast<uint8_t>(state_[i] >> (24 - 8 * j));
  return out;
}

std::string to_hex(const sha256::digest& d) {
  static const char* digits = "0123456789abcdef";
  std::string s(64, '0');
  for (size_t i = 0; i < d.size(); ++i) {
    s[2 * i] = digits[d[i] >> 4];
    s[2 * i + 1] = digits[d[i] & 15];
  }
  return s;
}

std::string sha256_hex(const void* data, size_t size) {
  sha256 h;
  h.update(data, size);
  return to_hex(h.finish());
}

std::string sha256_hex(const std::string& bytes) {
  return sha256_hex(bytes.data(), bytes.size());
}

std::string sha256_file_hex(const std::filesystem::path& file) {
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw error(errc::bad_input, file.string() + ": cannot open to hash: " + std::strerror(errno));
  ::posix_fadvise(fd, 0, 0, POSIX_FADV_SEQUENTIAL);
  constexpr size_t block = size_t{4} << 20;
  std::unique_ptr<uint8_t[]> buf(new uint8_t[block]);
  sha256 h;
  for (;;) {
    const ssize_t n = ::read(fd, buf.get(), block);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      const std::string why = std::strerror(errno);
      ::close(fd);
      throw error(errc::bad_input, file.string() + ": cannot read to hash: " + why);
    }
    if (n == 0)
      break;
    h.update(buf.get(), static_cast<size_t>(n));
  }
  ::close(fd);
  return to_hex(h.finish());
}

} // namespace tandem::gpu::data
