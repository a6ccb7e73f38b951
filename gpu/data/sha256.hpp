#pragma once
/// SHA-256 (FIPS 180-4), for `--verify` of token shards against the
/// manifest. Self-contained: no OpenSSL. Uses the x86 SHA extensions when
/// the CPU has them (checked at run time), the portable code otherwise; both
/// give the same digest. Torch-free.

#include <array>
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <string>

namespace tandem::gpu::data {

/// An incremental SHA-256: update() any number of times, then finish() once.
class sha256 {
public:
  using digest = std::array<uint8_t, 32>;

  /// `allow_hardware = false` forces the portable code (tests compare both).
  explicit sha256(bool allow_hardware = true);

  void update(const void* data, size_t size);

  /// The digest of everything given to update(); the object is spent after.
  digest finish();

  /// Whether this CPU has the SHA extensions the fast path uses.
  static bool hardware_available();

private:
  void compress(const uint8_t* blocks, size_t count);

  std::array<uint32_t, 8> state_;
  std::array<uint8_t, 64> buffer_{};
  size_t buffered_ = 0;
  uint64_t total_bytes_ = 0;
  bool hardware_;
};

/// Lowercase hexadecimal text of a digest (64 characters).
std::string to_hex(const sha256::digest& d);

/// sha256 of `size` bytes, as lowercase hex.
std::string sha256_hex(const void* data, size_t size);

/// sha256 of a string's bytes, as lowercase hex.
std::string sha256_hex(const std::string& bytes);

/// sha256 of a whole file, as lowercase hex, read sequentially in large
/// blocks. Throws gpu::error(bad_input) naming the file if it cannot be read.
std::string sha256_file_hex(const std::filesystem::path& file);

} // namespace tandem::gpu::data
