#pragma once
/// CRC-32C (Castagnoli, the iSCSI / ext4 polynomial 0x1EDC6F41, reflected),
/// the checksum of every tensor in a drafter checkpoint (checkpoint_io.hpp).
/// Uses the SSE4.2 `crc32` instruction when the CPU has it (about 8 GB/s on
/// one core: a 12.6 GB Qwen3-8B drafter checkpoint in ~1.6 s) and a
/// slicing-by-8 table otherwise; both give the same value.  Torch-free.
///
/// Check value: crc32c("123456789") = 0xE3069283 (RFC 3720, B.4).

#include <cstddef>
#include <cstdint>
#include <string>

namespace tandem::gpu {

/// Continues `crc` (0 to start) over `n` bytes at `p`.
uint32_t crc32c(const void* p, size_t n, uint32_t crc = 0);

/// The same with the portable table code only (tests compare the two).
uint32_t crc32c_portable(const void* p, size_t n, uint32_t crc = 0);

/// `crc` as 8 lower-case hex digits (how state.json stores it).
std::string crc32c_hex(uint32_t crc);

} // namespace tandem::gpu
