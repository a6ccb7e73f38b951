#include "gpu/data/verify_once.hpp"

#include <condition_variable>
#include <map>
#include <memory>
#include <mutex>
#include <string>

#include "gpu/device/error.hpp"

namespace tandem::gpu::data {

namespace {

namespace fs = std::filesystem;

/// One shard's verification: idle → running (one thread) → done.
struct entry {
  std::mutex mutex;
  std::condition_variable done_cv;
  bool running = false;
  bool done = false;
  std::string error;  ///< "" = verified
};

/// The process's results, by key; entries are never removed (a few per
/// shard file: tiny).
std::mutex registry_mutex;
std::map<std::string, std::shared_ptr<entry>>& registry() {
  static std::map<std::string, std::shared_ptr<entry>> r;
  return r;
}

std::string key_of(const dataset& ds, size_t index, const shard_check& check) {
  const auto path = ds.shard_path(index);
  std::error_code ec;
  const auto absolute = fs::absolute(path, ec).lexically_normal();
  const auto size = fs::file_size(path, ec);
  const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
  const int64_t limit = check.vocab_size > 0 && check.vocab_size < ds.vocab_size()
                          ? check.vocab_size
                          : ds.vocab_size();
  return absolute.string() + '\n' + std::to_string(size) + '\n' + std::to_string(mtime) + '\n'
         + ds.manifest().shards[index].sha256 + '\n' + (check.sha256 ? "sha" : "-") + '\n'
         + std::to_string(limit) + '\n' + check.vocab_source;
}

} // namespace

void verify_shard_once(const dataset& ds, size_t index, const shard_check& check) {
  std::shared_ptr<entry> e;
  {
    std::lock_guard<std::mutex> lock(registry_mutex);
    auto& slot = registry()[key_of(ds, index, check)];
    if (!slot)
      slot = std::make_shared<entry>();
    e = slot;
  }
  std::unique_lock<std::mutex> lock(e->mutex);
  if (!e->done && e->running)
    e->done_cv.wait(lock, [&] { return e->done; });
  if (!e->done) {
    e->running = true;
    lock.unlock();
    std::string why;
    try {
      ds.verify_shard(index, check);
    } catch (const std::exception& x) {
      why = x.what();
    }
    lock.lock();
    e->error = why;
    e->done = true;
    e->running = false;
    e->done_cv.notify_all();
  }
  if (!e->error.empty())
    throw error(errc::bad_input, e->error);
}

} // namespace tandem::gpu::data
