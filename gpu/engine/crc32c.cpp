#include "gpu/engine/crc32c.hpp"

#include <array>
#include <cstdio>
#include <cstring>

namespace tandem::gpu {

namespace {

constexpr uint32_t poly = 0x82F63B78u;  // 0x1EDC6F41 reflected

using table_t = std::array<std::array<uint32_t, 256>, 8>;

constexpr table_t make_tables() {
  table_t t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k)
      c = (c & 1) ? (c >> 1) ^ poly : c >> 1;
    t[0][i] = c;
  }
  for (int s = 1; s < 8; ++s)
    for (uint32_t i = 0; i < 256; ++i)
      t[s][i] = (t[s - 1][i] >> 8) ^ t[0][t[s - 1][i] & 0xFF];
  return t;
}

constexpr table_t tables = make_tables();

uint32_t portable_raw(const uint8_t* p, size_t n, uint32_t c) {
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian hosts only (x86-64, aarch64)
    w ^= c;
    c = tables[7][w & 0xFF] ^ tables[6][(w >> 8) & 0xFF] ^ tables[5][(w >> 16) & 0xFF]
        ^ tables[4][(w >> 24) & 0xFF] ^ tables[3][(w >> 32) & 0xFF] ^ tables[2][(w >> 40) & 0xFF]
        ^ tables[1][(w >> 48) & 0xFF] ^ tables[0][w >> 56];
    p += 8;
    n -= 8;
  }
  while (n-- > 0)
    c = (c >> 8) ^ tables[0][(c ^ *p++) & 0xFF];
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t hardware_raw(const uint8_t* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    c64 = __builtin_ia32_crc32di(c64, w);
    p += 8;
    n -= 8;
  }
  auto c32 = static_cast<uint32_t>(c64);
  while (n-- > 0)
    c32 = __builtin_ia32_crc32qi(c32, *p++);
  return c32;
}

bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

} // namespace

uint32_t crc32c_portable(const void* p, size_t n, uint32_t crc) {
  return ~portable_raw(static_cast<const uint8_t*>(p), n, ~crc);
}

uint32_t crc32c(const void* p, size_t n, uint32_t crc) {
#if defined(__x86_64__)
  if (have_sse42())
    return ~hardware_raw(static_cast<const uint8_t*>(p), n, ~crc);
#endif
  return crc32c_portable(p, n, crc);
}

std::string crc32c_hex(uint32_t crc) {
  char s[9];
  std::snprintf(s, sizeof s, "%08x", crc);
  return s;
}

} // namespace tandem::gpu
