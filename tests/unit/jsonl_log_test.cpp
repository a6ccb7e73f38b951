// actors/jsonl_log.hpp: a torn last line is cut on open; a write that fails
// (here: past RLIMIT_FSIZE, EFBIG, as a full disk fails with ENOSPC) leaves
// no partial record, keeps the lines in order, and writes them once it can.
#include <csignal>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <sys/resource.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "actors/jsonl_log.hpp"

namespace fs = std::filesystem;
using tandem::jsonl_log;

namespace {

fs::path fresh(const std::string& name) {
  auto p = fs::temp_directory_path() / ("tandem_jsonl_" + name + "_" + std::to_string(::getpid()) + ".jsonl");
  fs::remove(p);
  return p;
}

std::string slurp(const fs::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

void spit(const fs::path& p, const std::string& text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f << text;
}

} // namespace

TEST(jsonl_log, cuts_a_torn_last_line) {
  const auto p = fresh("torn");
  spit(p, "{\"a\":1}\n{\"b\":2}\n{\"c\":");
  {
    jsonl_log log;
    log.open(p);
    EXPECT_EQ(log.repaired(), 5u);
    EXPECT_TRUE(log.append("{\"d\":4}"));
  }
  EXPECT_EQ(slurp(p), "{\"a\":1}\n{\"b\":2}\n{\"d\":4}\n");
  // A whole file that is one torn line goes entirely; a sound file is kept.
  spit(p, "{\"x\":");
  {
    jsonl_log log;
    log.open(p);
    EXPECT_EQ(log.repaired(), 5u);
  }
  EXPECT_EQ(slurp(p), "");
  spit(p, "{\"a\":1}\n");
  {
    jsonl_log log;
    log.open(p);
    EXPECT_EQ(log.repaired(), 0u);
    log.append("{\"b\":2}");
  }
  EXPECT_EQ(slurp(p), "{\"a\":1}\n{\"b\":2}\n");
  fs::remove(p);
}

TEST(jsonl_log, last_line_is_the_last_complete_one) {
  const auto p = fresh("last");
  EXPECT_EQ(tandem::jsonl_last_line(p), "");  // no file
  spit(p, "");
  EXPECT_EQ(tandem::jsonl_last_line(p), "");
  spit(p, "{\"a\":1}\n{\"end\":2}\n");
  EXPECT_EQ(tandem::jsonl_last_line(p), "{\"end\":2}");
  spit(p, "{\"a\":1}\n{\"end\":2}\n\n  \n");  // blank lines after it
  EXPECT_EQ(tandem::jsonl_last_line(p), "{\"end\":2}");
  spit(p, "{\"a\":1}\n{\"b\":");  // torn: the line before it
  EXPECT_EQ(tandem::jsonl_last_line(p), "{\"a\":1}");
  spit(p, "{\"b\":");
  EXPECT_EQ(tandem::jsonl_last_line(p), "");
  // Only the file's end is read: a long file's last line, and a "line"
  // longer than the MiB looked at is none of ours.
  spit(p, std::string(3u << 20, 'x') + "\n{\"e\":1}\n");
  EXPECT_EQ(tandem::jsonl_last_line(p), "{\"e\":1}");
  spit(p, "{\"a\":1}\n" + std::string(2u << 20, 'x') + "\n");
  EXPECT_EQ(tandem::jsonl_last_line(p), "");
  fs::remove(p);
}

TEST(jsonl_log, a_failed_write_waits_and_loses_nothing) {
  const auto p = fresh("full");
  std::signal(SIGXFSZ, SIG_IGN);  // past the limit: EFBIG instead of the signal
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  const std::string line(20, 'x');  // 21 bytes a record
  std::vector<std::string> want;
  {
    jsonl_log log;
    log.open(p);
    for (int i = 0; i < 3; ++i) {
      want.push_back(line + std::to_string(i));
      ASSERT_TRUE(log.append(want.back()));
    }
    // The file may hold 3 records and a half: the fourth fails half-way.
    rlimit small = old;
    small.rlim_cur = static_cast<rlim_t>(fs::file_size(p) + 10);
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &small), 0);
    for (int i = 3; i < 8; ++i) {
      want.push_back(line + std::to_string(i));
      EXPECT_FALSE(log.append(want.back()));
    }
    EXPECT_EQ(log.pending(), 5u);
    EXPECT_FALSE(log.trouble().empty());
    EXPECT_EQ(fs::file_size(p), 3 * 22u);  // no partial record
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
    want.push_back(line + "8");
    EXPECT_TRUE(log.append(want.back()));
    EXPECT_EQ(log.pending(), 0u);
    EXPECT_TRUE(log.trouble().empty());
  }
  std::string all;
  for (const auto& w : want)
    all += w + "\n";
  EXPECT_EQ(slurp(p), all);
  std::signal(SIGXFSZ, SIG_DFL);
  fs::remove(p);
}

TEST(jsonl_log, bounded_while_failing) {
  const auto p = fresh("bounded");
  std::signal(SIGXFSZ, SIG_IGN);
  rlimit old{};
  ASSERT_EQ(::getrlimit(RLIMIT_FSIZE, &old), 0);
  {
    jsonl_log log;
    log.open(p, 4);
    rlimit none = old;
    none.rlim_cur = 1;
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &none), 0);
    for (int i = 0; i < 10; ++i)
      log.append(std::to_string(i));
    ASSERT_EQ(::setrlimit(RLIMIT_FSIZE, &old), 0);
    EXPECT_EQ(log.pending(), 4u);
    EXPECT_EQ(log.dropped(), 6u);
    EXPECT_TRUE(log.flush());
  }
  EXPECT_EQ(slurp(p), "6\n7\n8\n9\n");
  std::signal(SIGXFSZ, SIG_DFL);
  fs::remove(p);
}
