#pragma once
/// An append-only JSON-lines file that loses nothing it can keep: the
/// writer of metrics.jsonl (actors/metrics.cpp).
///
/// - Opening repairs a torn last line (a record a killed or starved process
///   did not finish: no newline at the end of the file) by cutting it, so a
///   resumed run's first record does not glue onto it; `repaired()` says how
///   many bytes went.
/// - A line that cannot be written (disk full, quota, I/O error) leaves no
///   partial record (the file is cut back to its last complete line) and is
///   kept in memory with those after it, in order, until a later append or
///   flush() can write them; `trouble()` says why meanwhile.  At most
///   `max_pending` lines wait (the oldest beyond that are dropped and
///   counted in `dropped()`).
///
/// One writer per file (the run's metrics actor); not thread-safe.
#include <cstdint>
#include <deque>
#include <filesystem>
#include <string>

namespace tandem {

/// The end of a JSON-lines file open as `fd`, `size` bytes long: `complete`
/// is the byte after its last complete line (a last line without its
/// newline is torn: `torn`, cut there), looked for in the last MiB (past
/// that, a longer line counts as complete).  Throws std::runtime_error
/// naming `path` when it cannot be read.
struct jsonl_tail {
  uint64_t complete = 0;
  bool torn = false;
};
jsonl_tail jsonl_tail_of(int fd, uint64_t size, const std::filesystem::path& path);

/// jsonl_tail_of(...).complete of the file at `path` (0 when it cannot be
/// read): where lines appended from now on will begin.
uint64_t jsonl_complete_size(const std::filesystem::path& path);

/// The last complete, non-blank line of the file at `path`, without its
/// newline, looked for in the last MiB before jsonl_complete_size; "" when
/// there is none or the file cannot be read.
std::string jsonl_last_line(const std::filesystem::path& path);

class jsonl_log {
 public:
  jsonl_log() = default;
  ~jsonl_log();
  jsonl_log(const jsonl_log&) = delete;
  jsonl_log& operator=(const jsonl_log&) = delete;

  /// Opens (creates) `path` for appending.  Throws std::runtime_error naming
  /// the path when it cannot be opened or repaired.
  void open(const std::filesystem::path& path, size_t max_pending = 200000);
  bool is_open() const { return fd_ >= 0; }
  /// Appends `line` (without its newline) and writes what waits.  Returns
  /// whether everything is on file now.
  bool append(const std::string& line);
  /// Writes what waits; whether nothing waits any more.
  bool flush();
  void close();

  size_t pending() const { return pending_.size(); }
  uint64_t dropped() const { return dropped_; }
  uint64_t repaired() const { return repaired_; }
  /// Why the last write failed ("" = the last one succeeded).
  const std::string& trouble() const { return trouble_; }
  const std::filesystem::path& path() const { return path_; }

 private:
  std::filesystem::path path_;
  int fd_ = -1;
  uint64_t good_ = 0;  ///< the file's size up to its last complete line
  bool cut_due_ = false;  ///< a failed write's bytes past good_ could not be cut yet
  std::deque<std::string> pending_;
  size_t max_pending_ = 0;
  uint64_t dropped_ = 0;
  uint64_t repaired_ = 0;
  std::string trouble_;
};

} // namespace tandem
