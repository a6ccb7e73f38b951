#include "actors/tensorboard/writer.hpp"

#include <chrono>
#include <cstring>
#include <stdexcept>

#include <unistd.h>

#include <boost/crc.hpp>

#include "actors/tensorboard/event.pb.h"

namespace tandem::tensorboard {

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i)
    out.push_back(static_cast<char>((v >> (8 * i)) & 0xff));
}

} // namespace

uint32_t masked_crc32c(std::string_view data) {
  // CRC-32C (Castagnoli, 0x1EDC6F41), reflected in and out, init and final
  // XOR all ones; then TensorFlow's mask: rotate right by 15, add a constant.
  boost::crc_optimal<32, 0x1EDC6F41, 0xFFFFFFFF, 0xFFFFFFFF, true, true> crc;
  crc.process_bytes(data.data(), data.size());
  const uint32_t c = crc.checksum();
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

std::string record(std::string_view payload) {
  std::string out;
  out.reserve(payload.size() + 16);
  put_le(out, payload.size(), 8);
  put_le(out, masked_crc32c(out), 4);
  out.append(payload);
  put_le(out, masked_crc32c(payload), 4);
  return out;
}

writer::writer(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  char host[256] = "localhost";
  ::gethostname(host, sizeof host - 1);
  const auto secs = static_cast<long long>(wall_now());
  path_ = dir / ("events.out.tfevents." + std::to_string(secs) + "." + host + "." + std::to_string(::getpid()));
  file_ = std::fopen(path_.c_str(), "ab");
  if (!file_)
    throw std::runtime_error(path_.string() + ": cannot write a TensorBoard event file: " + std::strerror(errno));
  Event first;
  first.set_wall_time(wall_now());
  first.set_file_version("brain.Event:2");
  write(first.SerializeAsString());
  flush();
}

writer::~writer() {
  if (file_)
    std::fclose(file_);
}

void writer::scalars(int64_t step, const std::vector<std::pair<std::string, double>>& values) {
  Event e;
  e.set_wall_time(wall_now());
  e.set_step(step);
  auto* summary = e.mutable_summary();
  for (const auto& [tag, v] : values) {
    auto* value = summary->add_value();
    value->set_tag(tag);
    value->set_simple_value(static_cast<float>(v));
  }
  write(e.SerializeAsString());
}

void writer::write(const std::string& event_bytes) {
  const auto r = record(event_bytes);
  std::fwrite(r.data(), 1, r.size(), file_);
}

void writer::flush() {
  std::fflush(file_);
}

} // namespace tandem::tensorboard
