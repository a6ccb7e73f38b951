// A fatal signal's report on stderr (commands.hpp: report_crashes).

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstddef>

#include "commands.hpp"

namespace tandem::cli {

namespace {

const char* crash_who = "tandem";

/// Appends `s` to `buf` (of `cap` bytes, `len` used), as far as it fits.
void append(char* buf, size_t cap, size_t& len, const char* s) {
  for (; *s != '\0' && len + 1 < cap; ++s)
    buf[len++] = *s;
}

/// Only async-signal-safe calls, except backtrace(), whose first call may
/// allocate (report_crashes makes that call beforehand).  The header goes
/// out in one write, so other threads' output cannot split it.
void on_crash(int sig) {
  char line[512];
  size_t len = 0;
  append(line, sizeof line, len, "\n");
  append(line, sizeof line, len, crash_who);
  append(line, sizeof line, len, ": fatal signal ");
  append(line, sizeof line, len,
         sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
         : sig == SIGILL ? "SIGILL" : "SIGABRT");
  append(line, sizeof line, len,
         "; the stack (addresses resolve with addr2line -f -C -e <binary> <offset>):\n");
  const ssize_t ignored = ::write(STDERR_FILENO, line, len);
  (void)ignored;
  void* frames[64];
  const int n = ::backtrace(frames, 64);
  ::backtrace_symbols_fd(frames, n, STDERR_FILENO);
  std::signal(sig, SIG_DFL);  // then die of it, as without this report
  ::raise(sig);
}

} // namespace

void report_crashes(const char* who) {
  crash_who = who;
  void* warm[1];
  (void)::backtrace(warm, 1);  // loads libgcc's unwinder now, not inside the handler
  struct sigaction sa {};
  sa.sa_handler = on_crash;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND;
  for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT})
    ::sigaction(sig, &sa, nullptr);
}

} // namespace tandem::cli
