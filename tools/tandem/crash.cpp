// A fatal signal's report on stderr (commands.hpp: report_crashes).

#include <execinfo.h>
#include <unistd.h>

#include <csignal>
#include <cstring>

#include "commands.hpp"

namespace tandem::cli {

namespace {

const char* crash_who = "tandem";

void write_text(const char* s) {
  const ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

/// Only async-signal-safe calls, except backtrace(), whose first call may
/// allocate (report_crashes makes that call beforehand).
void on_crash(int sig) {
  write_text("\n");
  write_text(crash_who);
  write_text(": fatal signal ");
  write_text(sig == SIGSEGV ? "SIGSEGV" : sig == SIGBUS ? "SIGBUS" : sig == SIGFPE ? "SIGFPE"
             : sig == SIGILL ? "SIGILL" : "SIGABRT");
  write_text("; the stack (addresses resolve with addr2line -f -C -e <binary> <offset>):\n");
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
