#pragma once
/// TensorBoard event files: RUN_DIR/tb/events.out.tfevents.SECONDS.HOST.PID,
/// TFRecord framing of Event protos (actors/tensorboard/event.proto), each
/// record `uint64 length, uint32 masked_crc32c(length), data,
/// uint32 masked_crc32c(data)` (little-endian; CRC32C via Boost.CRC, masked
/// as TensorFlow does).  The first record is file_version "brain.Event:2".
/// Used by the metrics actor (one writer, one thread).

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace tandem::tensorboard {

/// TensorFlow's masked CRC32C of `data` (exposed for the unit test).
uint32_t masked_crc32c(std::string_view data);

/// One TFRecord: the framing around `payload`.
std::string record(std::string_view payload);

class writer {
 public:
  /// Creates `dir` and a new event file in it; throws std::runtime_error
  /// naming the path when it cannot.
  explicit writer(const std::filesystem::path& dir);
  ~writer();
  writer(const writer&) = delete;
  writer& operator=(const writer&) = delete;

  /// Scalars of one step, one Event (wall time now).
  void scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values);
  void flush();
  const std::filesystem::path& path() const { return path_; }

 private:
  void write(const std::string& event_bytes);
  std::filesystem::path path_;
  std::FILE* file_ = nullptr;
};

} // namespace tandem::tensorboard
