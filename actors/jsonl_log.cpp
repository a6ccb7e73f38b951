// jsonl_log: see actors/jsonl_log.hpp.
#include "actors/jsonl_log.hpp"

#include <cerrno>
#include <cstring>
#include <stdexcept>
#include <vector>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace tandem {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

} // namespace

jsonl_tail jsonl_tail_of(int fd, uint64_t size, const std::filesystem::path& path) {
  jsonl_tail t{size, false};
  if (size == 0)
    return t;
  // Looked for in the file's last MiB: a longer "line" is no torn record of
  // ours (complete stays at size).
  const uint64_t from = size > (1u << 20) ? size - (1u << 20) : 0;
  std::vector<char> tail(static_cast<size_t>(size - from));
  const auto got = ::pread(fd, tail.data(), tail.size(), static_cast<off_t>(from));
  if (got != static_cast<ssize_t>(tail.size()))
    throw std::runtime_error(path.string() + ": cannot read its last line: " + errno_text(got < 0 ? errno : EIO));
  if (tail.back() == '\n')
    return t;
  t.torn = true;
  size_t i = tail.size();
  while (i > 0 && tail[i - 1] != '\n')
    --i;
  if (i > 0 || from == 0)
    t.complete = from + i;
  return t;
}

uint64_t jsonl_complete_size(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return 0;
  struct stat st {};
  uint64_t end = 0;
  try {
    if (::fstat(fd, &st) == 0)
      end = jsonl_tail_of(fd, static_cast<uint64_t>(st.st_size), path).complete;
  } catch (const std::runtime_error&) {
    end = 0;
  }
  ::close(fd);
  return end;
}

std::string jsonl_last_line(const std::filesystem::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    return {};
  std::string tail;
  uint64_t from = 0;
  try {
    struct stat st {};
    const uint64_t end =
      ::fstat(fd, &st) == 0 ? jsonl_tail_of(fd, static_cast<uint64_t>(st.st_size), path).complete : 0;
    from = end > (1u << 20) ? end - (1u << 20) : 0;
    tail.resize(static_cast<size_t>(end - from));
    if (::pread(fd, tail.data(), tail.size(), static_cast<off_t>(from)) != static_cast<ssize_t>(tail.size()))
      tail.clear();
  } catch (const std::runtime_error&) {
    tail.clear();
  }
  ::close(fd);
  auto blank = [](char c) { return c == '\n' || c == '\r' || c == ' ' || c == '\t'; };
  size_t stop = tail.size();
  while (stop > 0 && blank(tail[stop - 1]))
    --stop;
  if (stop == 0)
    return {};
  const auto nl = tail.rfind('\n', stop - 1);
  if (nl == std::string::npos && from > 0)
    return {};  // longer than a MiB: no line of ours
  const size_t start = nl == std::string::npos ? 0 : nl + 1;
  return tail.substr(start, stop - start);
}

jsonl_log::~jsonl_log() { close(); }

void jsonl_log::open(const std::filesystem::path& path, size_t max_pending) {
  close();
  path_ = path;
  max_pending_ = max_pending == 0 ? 1 : max_pending;
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0)
    throw std::runtime_error(path.string() + ": cannot open for appending: " + errno_text(errno));
  struct stat st {};
  if (::fstat(fd_, &st) != 0) {
    const int e = errno;
    close();
    throw std::runtime_error(path.string() + ": cannot stat: " + errno_text(e));
  }
  auto size = static_cast<uint64_t>(st.st_size);
  // A torn last line: cut back to the newline before it; a last "line"
  // longer than jsonl_tail_of looks is ended with a newline instead, so the
  // next record stands on its own.
  jsonl_tail t;
  try {
    t = jsonl_tail_of(fd_, size, path);
  } catch (...) {
    close();
    throw;
  }
  if (t.complete < size) {
    if (::ftruncate(fd_, static_cast<off_t>(t.complete)) != 0) {
      const int e = errno;
      close();
      throw std::runtime_error(path.string() + ": cannot cut its torn last line: " + errno_text(e));
    }
    repaired_ = size - t.complete;
    size = t.complete;
  } else if (t.torn) {
    pending_.push_back("\n");
  }
  good_ = size;
}

bool jsonl_log::append(const std::string& line) {
  if (fd_ < 0)
    return false;
  if (pending_.size() >= max_pending_) {
    pending_.pop_front();
    ++dropped_;
  }
  pending_.push_back(line + "\n");
  return flush();
}

bool jsonl_log::flush() {
  if (fd_ < 0)
    return pending_.empty();
  while (!pending_.empty()) {
    const auto& text = pending_.front();
    size_t done = 0;
    int failed = 0;
    while (done < text.size()) {
      const auto n = ::pwrite(fd_, text.data() + done, text.size() - done, static_cast<off_t>(good_ + done));
      if (n < 0 && errno == EINTR)
        continue;
      if (n <= 0) {
        failed = n < 0 ? errno : ENOSPC;
        break;
      }
      done += static_cast<size_t>(n);
    }
    if (failed != 0) {
      // No partial record stays behind: cut back to the last complete line
      // (or, when even that fails, once a later write succeeds).
      if (done > 0 && ::ftruncate(fd_, static_cast<off_t>(good_)) != 0)
        cut_due_ = true;
      trouble_ = errno_text(failed);
      return false;
    }
    good_ += text.size();
    pending_.pop_front();
  }
  if (cut_due_ && ::ftruncate(fd_, static_cast<off_t>(good_)) == 0)
    cut_due_ = false;
  trouble_.clear();
  return true;
}

void jsonl_log::close() {
  if (fd_ >= 0) {
    flush();
    ::close(fd_);
    fd_ = -1;
  }
}

} // namespace tandem
