// `tandem run CONFIG.toml`: single-node training.  Argument handling and
// the signal loop; the config becomes a launch plan (launch/plan.hpp), the
// plan an actor system (actors/system.hpp), which runs until max_steps, the
// last epoch or a signal.  `--resume` continues from the newest checkpoint.
//
// The process that starts is a small parent (no CUDA, no actors) that runs
// the training in a worker process it forks, and starts a new worker when
// one dies: by a signal (an abort, the kernel's OOM killer) or with exit
// status 75, a lost CUDA context (errc::device_lost), which nothing inside
// the process survives.  Each new worker resumes from the newest restore
// point that outlived the old one: a restore point in shared memory
// (checkpoint.host_every) or a checkpoint.  supervision.worker_restarts = 0
// trains in the first process, with no parent.
#include <fcntl.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <optional>
#include <set>
#include <stdexcept>
#include <thread>

#include <caf/all.hpp>
#include <caf/io/all.hpp>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include "actors/cluster.hpp"
#include "actors/cluster_gate.hpp"
#include "actors/jsonl_log.hpp"
#include "actors/system.hpp"
#include "commands.hpp"
#include "gpu/data/dataset.hpp"
#include "gpu/data/identity.hpp"
#include "gpu/io/model_tokens.hpp"
#include "gpu/data/packing.hpp"
#include "gpu/engine/lr_schedule.hpp"
#include "gpu/io/hf_config.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/device/runtime.hpp"
#include "gpu/transport/link.hpp"
#include "gpu/transport/transport.hpp"
#include "launch/plan.hpp"
#include "launch/run_config.hpp"
#include "messages/errors.hpp"
#include "messages/registry.hpp"

namespace tandem::cli {

namespace {

std::atomic<int> stop_signal{0};

extern "C" void on_signal(int sig) {
  stop_signal.store(sig);
}

struct run_options {
  std::string config;
  bool resume = false;
  std::vector<std::string> overrides;
  std::vector<std::string> faults;
  bool force = false;
  bool overwrite = false;    ///< a fresh start may remove an earlier run in the folder
  std::string listen, name;  ///< --listen, --name: cluster.listen, cluster.name
};

/// The exit status of a worker whose device context is lost: its parent
/// starts a new one (EX_TEMPFAIL).
constexpr int device_lost_status = 75;

/// What a worker process is told by its parent.
struct worker_context {
  bool resume_if_any = false;     ///< a restarted worker: resume when anything can be resumed
  std::string fired_file;         ///< fault_plan::fired_file
  std::optional<worker_restarted_event> restarted;  ///< the worker_restarted event (none: the first worker)
  /// The parent holds run.output_dir/.lock for every worker it starts (its
  /// descriptor is theirs too), so the folder stays locked between them.
  bool folder_locked = false;
};

/// Writes `text` to `path` whole or not at all (a reader never sees half of
/// it): a temporary file of mode `mode`, fsynced, renamed over it.
void write_atomically(const std::filesystem::path& path, const std::string& text, mode_t mode) {
  const auto tmp = path.string() + ".tmp";
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, mode);
  if (fd < 0 || ::fchmod(fd, mode) != 0 || ::write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())
      || ::fsync(fd) != 0 || ::close(fd) != 0 || ::rename(tmp.c_str(), path.c_str()) != 0)
    throw std::runtime_error("cannot write " + path.string() + ": " + std::strerror(errno));
}

/// RUN_DIR/control.json: where the control endpoint listens and its token,
/// readable by this user only (mode 0600, set before anything is written).
void write_control_file(const std::filesystem::path& path, const std::string& listen_host, uint16_t port,
                        const std::string& token, const std::string& run_name, bool tls) {
  // Where a client on this host connects (a wildcard address is not one).
  const std::string host = listen_host == "0.0.0.0" ? "127.0.0.1" : listen_host;
  const nlohmann::json j{{"url", std::string(tls ? "https://" : "http://") + host + ":" + std::to_string(port)},
                         {"host", host},
                         {"listen", listen_host},
                         {"tls", tls},
                         {"port", port},
                         {"token", token},
                         {"pid", static_cast<int64_t>(::getpid())},
                         {"run", run_name}};
  write_atomically(path, j.dump(2) + "\n", 0600);
}

/// The learning-rate multiplier's schedule kept in `file` by the metrics
/// actor ({"lr_scale": [[from, scale], ...]}); nullopt when there is none
/// (or it does not parse: said, and the checkpoint's schedule is used).
std::optional<std::vector<std::pair<int64_t, double>>> read_lr_schedule(const std::filesystem::path& file) {
  std::ifstream in(file);
  if (!in)
    return std::nullopt;
  const auto j = nlohmann::json::parse(in, nullptr, false);
  std::vector<std::pair<int64_t, double>> out;
  const bool ok = j.is_object() && j.contains("lr_scale") && j["lr_scale"].is_array()
                  && std::all_of(j["lr_scale"].begin(), j["lr_scale"].end(), [&](const nlohmann::json& c) {
                       if (!c.is_array() || c.size() != 2 || !c[0].is_number_integer() || !c[1].is_number()
                           || !(c[1].get<double>() > 0))
                         return false;
                       out.emplace_back(c[0].get<int64_t>(), c[1].get<double>());
                       return true;
                     });
  if (!ok) {
    std::fprintf(stderr, "tandem run: warning: %s: not {\"lr_scale\": [[step, multiplier], ...]}: ignored (the "
                         "checkpoint's schedule is used)\n", file.c_str());
    return std::nullopt;
  }
  return out;
}

double unix_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

/// A cluster run's newest checkpoint, as metrics.jsonl records it, when
/// it was written on a member's file system and cannot be read here while
/// the newest found here (`found`, "" = none) is older: the sentence that
/// names the node and the path --resume needs.  Resuming from the older one
/// would silently drop steps the run committed.
std::optional<std::string> missing_member_checkpoint(const run_config& cfg, const std::filesystem::path& found) {
  const auto jsonl = cfg.metrics_file();
  std::ifstream in(jsonl);
  if (jsonl.empty() || !in)
    return std::nullopt;
  int64_t step = -1;
  std::string dir, node;
  for (std::string line; std::getline(in, line);) {
    if (line.find("\"event\":\"checkpoint\"") == std::string::npos)
      continue;
    auto j = nlohmann::json::parse(line, nullptr, false);
    if (j.is_discarded() || j.value("event", "") != "checkpoint")
      continue;
    if (j.value("step", int64_t{-1}) >= step) {
      step = j.value("step", int64_t{-1});
      dir = j.value("dir", "");
      node = j.value("node", "");
    }
  }
  std::error_code ec;
  if (node.empty() || dir.empty() || std::filesystem::exists(dir, ec))
    return std::nullopt;
  int64_t found_step = -1;
  if (!found.empty()) {
    const auto extra = nlohmann::json::parse(gpu::read_checkpoint_extra(found), nullptr, false);
    if (extra.is_object() && extra.contains("step") && extra["step"].is_number_integer())
      found_step = extra["step"].get<int64_t>();
  }
  if (found_step >= step)
    return std::nullopt;
  return "the newest checkpoint, step " + std::to_string(step) + ", was written on node '" + node + "' at " + dir
         + ", which this machine cannot read" + (found.empty() ? std::string(" (none is here)") :
            " (the newest here, " + found.string() + ", holds step " + std::to_string(found_step) + ")")
         + ": copy that folder to the same path here, or put checkpoint.dir on a file system both share, "
           "and run --resume again (--force resumes from the older one, training the steps after it again)";
}

/// The step at which metrics.jsonl says the run ended, having trained all
/// it was asked to (the last record an "end" for its epochs or
/// train.max_steps, whose durable step is its last step: no step, and no
/// worker started by a --resume or a restart, after it; none lost), if it
/// does.  Only the lines from byte `from` on count (jsonl_complete_size).
std::optional<int64_t> clean_end_step(const run_config& cfg, std::streamoff from = 0) {
  const auto jsonl = cfg.metrics_file();
  std::ifstream in(jsonl);
  if (jsonl.empty() || !in)
    return std::nullopt;
  in.seekg(from);
  std::optional<int64_t> ended;
  int64_t last_step = -1;
  for (std::string line; std::getline(in, line);) {
    const bool end = line.find("\"event\":\"end\"") != std::string::npos;
    const bool started = line.find("\"event\":\"resumed\"") != std::string::npos
                         || line.find("\"event\":\"worker_restarted\"") != std::string::npos;
    if (!end && !started && line.find("\"event\":\"step\"") == std::string::npos)
      continue;  // (a restore point written after the end comes after it)
    const auto j = nlohmann::json::parse(line, nullptr, false);
    if (!j.is_object())
      continue;
    if (j.value("event", "") == "step") {
      ended.reset();
      last_step = j.value("step", int64_t{-1});
    } else if (j.value("event", "") != "end") {
      ended.reset();  // a worker started after the end (a --resume with more to train)
    } else {
      const auto durable = j.value("durable_step", int64_t{-1});
      const auto reason = j.value("reason", "");
      ended.reset();
      if ((reason == "epochs" || reason == "max_steps") && durable >= 0 && durable >= last_step)
        ended = durable;
    }
  }
  return ended;
}

/// Whether metrics.jsonl says the run ended at `step`, its durable step
/// (clean_end_step): a --resume from that checkpoint has nothing to do.  An
/// end not recorded (the process died after its last checkpoint) or one
/// for an error is written again by the resume.
bool ended_at(const run_config& cfg, int64_t step) {
  return clean_end_step(cfg) == step;
}


/// The restore points in shared memory of `plan`, if their folder can be
/// made: else the tier is turned off with a warning.
/// A fresh start (no --resume) into a folder that holds an earlier run (a
/// checkpoint, or a metrics.jsonl with lines): refused, since its steps would
/// mix with this run's and a later --resume would continue the older one;
/// with --overwrite that run is set aside later (earlier_run_aside), once the
/// new one has passed its checks.  Returns the exit status (0: go on) and,
/// in `what`, the earlier run ("" = none).
int check_fresh_start(const run_config& cfg, bool overwrite, std::string& what) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const auto ckpts = gpu::list_checkpoints(cfg.checkpoint_dir());
  const auto metrics = cfg.metrics_file();
  const bool has_metrics = !metrics.empty() && fs::is_regular_file(metrics, ec) && fs::file_size(metrics, ec) > 0;
  what.clear();
  if (ckpts.empty() && !has_metrics)
    return 0;
  what = ckpts.empty() ? "its " + metrics.filename().string()
                       : std::to_string(ckpts.size()) + " checkpoint(s), the newest " + ckpts.front().filename().string();
  if (overwrite)
    return 0;
  std::fprintf(stderr,
               "tandem run: %s already holds a run (%s); pass --resume to continue it, --overwrite to start "
               "again from step 0 (removes its checkpoints, metrics and event files; prepared data stays), or "
               "set run.output_dir to another folder\n",
               cfg.run.output_dir.c_str(), what.c_str());
  return 2;
}

/// Why `dir` cannot take this run's files (nullopt: it can): made if
/// missing, then a file created, written and removed in it.
std::optional<std::string> cannot_write(const std::filesystem::path& dir) {
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec)
    return "cannot make it: " + ec.message();
  const auto probe = dir / (".tandem-probe-" + std::to_string(::getpid()));
  const int fd = ::open(probe.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    return "cannot write in it: " + std::string(std::strerror(errno));
  const bool wrote = ::write(fd, "x", 1) == 1;
  const int e = errno;
  ::close(fd);
  ::unlink(probe.c_str());
  if (!wrote)
    return "cannot write in it: " + std::string(std::strerror(e));
  return std::nullopt;
}

/// Holds run.output_dir/.lock (flock) for this process's life, so a second
/// `tandem run` into the folder — a fresh start, a --resume, another
/// cluster leader — is refused instead of training into the same
/// checkpoints.  Taken by the parent, whose workers share its descriptor
/// (forked), or with supervision.worker_restarts = 0 by the one process.
/// Returns the exit status (0: held).
int lock_run_folder(const run_config& cfg) {
  const auto path = cfg.run.output_dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) {
    std::fprintf(stderr, "tandem run: cannot open %s: %s\n", path.c_str(), std::strerror(errno));
    return 1;
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    char pid[32] = {};
    const auto n = ::pread(fd, pid, sizeof pid - 1, 0);
    std::string holder = n > 0 ? std::string(pid, static_cast<size_t>(n)) : std::string("?");
    while (!holder.empty() && (holder.back() == '\n' || holder.back() == ' '))
      holder.pop_back();
    std::fprintf(stderr, "tandem run: %s is in use by another tandem run (process %s); wait for it to end, stop "
                         "it (tandem shell %s -c stop), or set run.output_dir to another folder\n",
                 cfg.run.output_dir.c_str(), holder.c_str(), cfg.run.output_dir.c_str());
    ::close(fd);
    return 2;
  }
  const auto text = std::to_string(::getpid()) + "\n";
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, text.data(), text.size(), 0) < 0)
    std::fprintf(stderr, "tandem run: warning: cannot write %s\n", path.c_str());
  return 0;  // fd stays open: the lock is held until this process ends
}

/// --overwrite: the earlier run's files — its checkpoints (step-* and latest
/// in checkpoint.dir), metrics.jsonl, TensorBoard event files (those files
/// only: metrics.tensorboard may be the run folder itself), and the run
/// folder's config.toml, lr_schedule.json, eval-prompts.jsonl and
/// cluster.json — set aside (renamed in place to NAME.overwritten) once the
/// new run has passed the checks that need nothing written, deleted once it
/// has a checkpoint of its own or ends well (discard), and put back as they
/// were when it stops before that (the destructor: a control port in use,
/// eval prompts it cannot use, members that never join, a failure before
/// its first checkpoint): a start that fails loses none of them (its
/// restore points in shared memory excepted: a fresh start empties
/// checkpoint.host_dir).  run.output_dir/.overwrite-pending, written and
/// synced before the first rename, lists what is set aside and what was not
/// there, so that the next start puts it back after a start killed by a
/// signal (recover), or finishes a discard that was cut short.
class earlier_run_aside {
 public:
  earlier_run_aside() = default;
  earlier_run_aside(const earlier_run_aside&) = delete;
  earlier_run_aside& operator=(const earlier_run_aside&) = delete;

  void set_aside(const run_config& cfg, const std::string& what) {
    namespace fs = std::filesystem;
    std::error_code ec;
    dir_ = cfg.run.output_dir.string();
    what_ = what;
    events_ = cfg.tensorboard_dir();
    std::vector<fs::path> present;
    for (const auto& f : run_files(cfg))
      (fs::exists(fs::symlink_status(f, ec)) ? present : absent_).push_back(f);
    marker_ = marker_path(cfg.run.output_dir);
    write_marker("pending", present);
    for (const auto& f : present) {
      const auto to = aside_name(f);
      fs::remove_all(to, ec);  // one a start that died half-way left
      fs::rename(f, to, ec);
      if (ec) {
        std::fprintf(stderr, "tandem run: --overwrite: cannot set %s aside (%s): removing it\n", f.c_str(),
                     ec.message().c_str());
        fs::remove_all(f, ec);
        continue;
      }
      moved_.push_back(f);
    }
  }

  /// Whether the earlier run is set aside (not yet discarded).
  bool pending() const { return !marker_.empty(); }

  /// Whether run.output_dir holds a marker (or a marker's cut-short write).
  static bool marker_in(const run_config& cfg) {
    std::error_code ec;
    const auto m = marker_path(cfg.run.output_dir);
    return std::filesystem::exists(std::filesystem::symlink_status(m, ec))
           || std::filesystem::exists(std::filesystem::symlink_status(m.string() + ".tmp", ec));
  }

  /// The new run has a checkpoint (or ended well): the earlier one's files go.
  void discard() {
    if (marker_.empty())
      return;
    std::error_code ec;
    try {
      write_marker("discarding", moved_);  // a start killed from here on goes on discarding, never puts back
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: warning: %s\n", e.what());
    }
    for (const auto& f : moved_)
      std::filesystem::remove_all(aside_name(f), ec);
    std::filesystem::remove(marker_, ec);
    std::fprintf(stderr, "tandem run: --overwrite: removed the earlier run in %s (%s)\n", dir_.c_str(),
                 what_.c_str());
    marker_.clear();
  }

  ~earlier_run_aside() {
    if (marker_.empty())
      return;
    put_back(moved_, absent_, events_);
    std::error_code ec;
    std::filesystem::remove(marker_, ec);
    std::fprintf(stderr, "tandem run: --overwrite: the new run ended before its first checkpoint; the earlier run's "
                         "files in %s are back as they were\n",
                 dir_.c_str());
  }

  /// Under the run folder's lock, before anything looks for a run: what an
  /// --overwrite start killed by a signal left.  Set aside ("pending"): put
  /// back as the destructor would have; "discarding": removed.  Without the
  /// marker, files named *.overwritten are only reported.  Returns how many
  /// files were put back.
  static size_t recover(const run_config& cfg) {
    namespace fs = std::filesystem;
    std::error_code ec;
    const auto marker = marker_path(cfg.run.output_dir);
    fs::remove(marker.string() + ".tmp", ec);  // a marker's write that was cut short
    if (!fs::exists(fs::symlink_status(marker, ec))) {
      size_t n = 0;
      fs::path one;
      for (const auto& f : run_files(cfg, true))
        if (fs::exists(fs::symlink_status(aside_name(f), ec)))
          ++n, one = aside_name(f);
      if (n > 0)
        std::fprintf(stderr, "tandem run: warning: %s holds %zu file(s) an --overwrite start set aside and did not "
                             "remove (e.g. %s): drop the .overwritten to keep them, or delete them\n",
                     cfg.run.output_dir.c_str(), n, one.c_str());
      return 0;
    }
    nlohmann::json m;
    try {
      std::ifstream in(marker);
      m = nlohmann::json::parse(in);
    } catch (const std::exception&) {
      std::fprintf(stderr, "tandem run: warning: %s cannot be read: the files set aside as *.overwritten in %s are "
                           "left as they are\n",
                   marker.c_str(), cfg.run.output_dir.c_str());
      return 0;
    }
    auto paths = [&](const char* key) {
      std::vector<fs::path> out;
      for (const auto& p : m.value(key, nlohmann::json::array()))
        if (p.is_string())
          out.emplace_back(p.get<std::string>());
      return out;
    };
    const auto moved = paths("moved");
    size_t back = 0;
    if (m.value("state", "") == "discarding") {
      for (const auto& f : moved)
        fs::remove_all(aside_name(f), ec);
    } else {
      for (const auto& f : moved)
        back += fs::exists(fs::symlink_status(aside_name(f), ec)) ? 1 : 0;
      put_back(moved, paths("absent"), fs::path(m.value("events", "")));
      std::fprintf(stderr, "tandem run: an --overwrite start in %s was stopped before its first checkpoint: put "
                           "the earlier run back (%zu file(s))\n",
                   cfg.run.output_dir.c_str(), back);
    }
    fs::remove(marker, ec);
    sync_folder(cfg.run.output_dir);
    return back;
  }

 private:
  /// Each of `moved` whose set-aside copy is there back in its place (over
  /// what the new start wrote there); `absent`, and event files in `events`
  /// that are none of `moved`, the new start's: removed.
  static void put_back(const std::vector<std::filesystem::path>& moved, const std::vector<std::filesystem::path>& absent,
                       const std::filesystem::path& events) {
    namespace fs = std::filesystem;
    std::error_code ec;
    for (auto f = moved.rbegin(); f != moved.rend(); ++f)
      if (fs::exists(fs::symlink_status(aside_name(*f), ec))) {
        fs::remove_all(*f, ec);
        fs::rename(aside_name(*f), *f, ec);
      }
    for (const auto& f : absent)
      fs::remove_all(f, ec);
    if (events.empty())
      return;
    std::vector<fs::path> made;
    for (const auto& e : fs::directory_iterator(events, ec))
      if (is_event_file(e.path()) && !aside(e.path()) && std::find(moved.begin(), moved.end(), e.path()) == moved.end())
        made.push_back(e.path());
    for (const auto& f : made)
      fs::remove(f, ec);
  }

  /// The marker, whole or not at all, and synced with its folder before a
  /// rename it describes.
  void write_marker(const char* state, const std::vector<std::filesystem::path>& moved) {
    nlohmann::json m{{"state", state}, {"what", what_},
                     {"events", events_.empty() ? std::string() : std::filesystem::absolute(events_).string()},
                     {"moved", nlohmann::json::array()}, {"absent", nlohmann::json::array()}};
    for (const auto& f : moved)
      m["moved"].push_back(std::filesystem::absolute(f).string());
    for (const auto& f : absent_)
      m["absent"].push_back(std::filesystem::absolute(f).string());
    write_atomically(marker_, m.dump() + "\n", 0644);
    sync_folder(marker_.parent_path());
  }
  static void sync_folder(const std::filesystem::path& dir) {
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
      ::fsync(fd);
      ::close(fd);
    }
  }
  static std::filesystem::path marker_path(const std::filesystem::path& run_dir) {
    return run_dir / ".overwrite-pending";
  }
  static bool is_event_file(const std::filesystem::path& p) {
    return p.filename().string().rfind("events.out.tfevents.", 0) == 0;
  }
  /// The files --overwrite sets aside; with `aside_ones`, the names (without
  /// the suffix) of those set aside now.
  static std::vector<std::filesystem::path> run_files(const run_config& cfg, bool aside_ones = false) {
    namespace fs = std::filesystem;
    std::error_code ec;
    std::vector<fs::path> files;
    auto strip = [](const fs::path& p) { return fs::path(p.string().substr(0, p.string().size() - 12)); };
    auto take = [&](const fs::path& p, const fs::path& named, bool ok) {
      if (aside(p) == aside_ones && ok)
        files.push_back(named);
    };
    for (const auto& e : fs::directory_iterator(cfg.checkpoint_dir(), ec)) {
      const auto named = aside(e.path()) ? strip(e.path()) : e.path();
      take(e.path(), named, gpu::is_checkpoint_entry(named.filename().string()));
    }
    if (!cfg.tensorboard_dir().empty())
      for (const auto& e : fs::directory_iterator(cfg.tensorboard_dir(), ec)) {
        const auto named = aside(e.path()) ? strip(e.path()) : e.path();
        take(e.path(), named, e.is_regular_file(ec) && is_event_file(named));
      }
    for (const auto& f : own_files(cfg))
      if (std::find(files.begin(), files.end(), f) == files.end())
        files.push_back(f);
    return files;
  }
  /// The run's files of fixed names: metrics.jsonl and the run folder's own.
  static std::vector<std::filesystem::path> own_files(const run_config& cfg) {
    std::vector<std::filesystem::path> named;
    if (!cfg.metrics_file().empty())
      named.push_back(cfg.metrics_file());
    for (const char* f : {"config.toml", "lr_schedule.json", "eval-prompts.jsonl", "cluster.json"})
      named.push_back(cfg.run.output_dir / f);
    return named;
  }
  static std::filesystem::path aside_name(const std::filesystem::path& p) {
    return p.string() + ".overwritten";
  }
  static bool aside(const std::filesystem::path& p) {
    const auto n = p.filename().string();
    return n.size() > 12 && n.compare(n.size() - 12, 12, ".overwritten") == 0;
  }
  std::vector<std::filesystem::path> moved_;   // where each was
  std::vector<std::filesystem::path> absent_;  // none there when set aside: what the new start writes there goes
  std::filesystem::path events_;               // metrics.tensorboard's folder
  std::filesystem::path marker_;               // run.output_dir/.overwrite-pending while set aside
  std::string dir_, what_;
};

/// checkpoint.host_dir, when set: a folder of the restore points' own (a
/// run empties it of checkpoints when it starts and removes it, empty, when
/// it ends), so not a file, not the run folder or its checkpoint.dir nor a
/// folder above either, and holding nothing but restore points.
void check_host_dir(const run_config& cfg) {
  namespace fs = std::filesystem;
  if (cfg.checkpoint.host_every <= 0 || cfg.checkpoint.host_dir.empty())
    return;
  const auto dir = host_restore_dir(cfg);
  auto refuse = [&](const std::string& why) {
    throw config_error((cfg.source.empty() ? std::string("config") : cfg.source.string()) + ": 'checkpoint.host_dir' = \""
                       + cfg.checkpoint.host_dir.string() + "\" (" + dir.string() + "): " + why);
  };
  std::error_code ec;
  auto resolved = [&ec](const fs::path& p) {  // links resolved, "." and ".." gone, no trailing separator
    auto q = fs::weakly_canonical(fs::absolute(p), ec).lexically_normal();
    return q.has_filename() || q == q.root_path() ? q : q.parent_path();
  };
  const auto canon = resolved(dir);
  for (const auto& [mine, field] : {std::pair{cfg.run.output_dir, "run.output_dir"},
                                    std::pair{cfg.checkpoint_dir(), "checkpoint.dir"}})
    for (auto p = resolved(mine); !p.empty(); p = p.parent_path()) {
      if (p == canon)
        refuse(std::string("it is ") + (p == resolved(mine) ? "" : "a folder above ")
               + field + " (" + mine.string() + "): restore points need a folder of their own, which a run empties "
               "when it starts");
      if (p == p.parent_path())
        break;
    }
  if (!fs::exists(dir, ec))
    return;
  if (!fs::is_directory(dir, ec))
    refuse("not a folder");
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (!gpu::is_checkpoint_entry(e.path().filename().string()))
      refuse("it holds " + e.path().filename().string() + ", which is not a restore point: restore points need a "
             "folder of their own, which a run empties when it starts (name a new or empty folder)");
}

/// A resume against the data and schedule the checkpoint recorded (its
/// "data" entry; checkpoints written before it was recorded pass): other
/// data (another content_hash) is refused, since the ledger's sample ids
/// would name other samples, unless --force; a schedule of another length
/// (data.epochs or the packing changed) is said, with the learning rate's
/// jump at the resumed step.  Returns the exit status (0: go on).
int check_resumed_data(const nlohmann::json& extra, const data_facts& facts, const run_config& cfg,
                       const std::filesystem::path& ckpt, bool force) {
  if (!extra.contains("data") || !extra["data"].is_object())
    return 0;
  const auto& d = extra["data"];
  const auto was = d.value("content_hash", std::string());
  if (!was.empty() && !facts.content_hash.empty() && was != facts.content_hash) {
    std::fprintf(stderr,
                 "tandem run --resume: %s%s was trained on another data set (content_hash %.12s...) than "
                 "data.path %s holds now (%.12s...): its ledger's sample ids would name other samples, so the "
                 "exactly-once accounting would mean nothing%s\n",
                 force ? "warning (--force): " : "", ckpt.c_str(), was.c_str(), cfg.data.path.c_str(),
                 facts.content_hash.c_str(),
                 force ? "; resuming anyway" : ". Point data.path at the data it was trained on, or pass --force");
    if (!force)
      return 2;
  }
  const auto steps = d.value("schedule_steps", int64_t{0});
  if (steps > 0 && facts.steps > 0 && steps != facts.steps) {
    const auto step = extra.value("step", int64_t{0});
    auto lr_at = [&](int64_t total) {  // the optimizer's own formula, at the next step
      return gpu::scheduled_lr(cfg.train.lr, cfg.train.warmup_ratio, total, step + 1);
    };
    std::fprintf(stderr,
                 "tandem run --resume: warning: the learning-rate schedule now spans %lld steps, %lld when %s "
                 "was written (data.epochs or the data changed): from step %lld the rate follows the new "
                 "schedule (about %.3g where the old one had %.3g)\n",
                 static_cast<long long>(facts.steps), static_cast<long long>(steps), ckpt.c_str(),
                 static_cast<long long>(step + 1), lr_at(facts.steps), lr_at(steps));
  }
  return 0;
}

void prepare_host_tier(launch_plan& plan, bool fresh_start) {
  if (plan.coordinator.host_every <= 0)
    return;
  const auto& dir = plan.host_checkpointer.dir;
  std::error_code ec;
  if (fresh_start)
    gpu::remove_checkpoints(dir);  // an earlier run's of this output folder
  std::filesystem::create_directories(dir, ec);
  if (ec) {
    std::fprintf(stderr, "tandem run: warning: checkpoint.host_dir %s cannot be made (%s): no restore points in "
                         "shared memory; a worker that dies resumes from the newest checkpoint\n",
                 dir.c_str(), ec.message().c_str());
    plan.coordinator.host_every = 0;
    return;
  }
  // The newest one and the one being written beside it.
  const auto one = gpu::checkpoint_bytes(gpu::drafter_engine::parameter_count(plan.drafters.front()));
  uint64_t have = gpu::available_bytes(dir);
  if (have == UINT64_MAX)
    return;  // cannot be asked
  for (const auto& c : gpu::list_checkpoints(dir))
    have += gpu::folder_bytes(c);
  if (have < 2 * one) {
    std::fprintf(stderr, "tandem run: warning: checkpoint.host_dir %s has %s free, but two restore points of this "
                         "drafter need %s: no restore points in shared memory (set checkpoint.host_dir to a larger "
                         "tmpfs, or checkpoint.host_every = 0 to silence this)\n",
                 dir.c_str(), gpu::human_bytes(have).c_str(), gpu::human_bytes(2 * one).c_str());
    plan.coordinator.host_every = 0;
  }
}

/// Refuses a run whose checkpoint folder cannot hold checkpoint.keep + 1
/// checkpoints of this drafter (the newest `keep` and the one being written
/// beside them), counting the space the run's existing checkpoints take;
/// --force runs anyway.  Returns the exit status (0: go on).
int check_checkpoint_space(const launch_plan& plan, bool force) {
  const auto& dir = plan.checkpointer.dir;
  const auto params = gpu::drafter_engine::parameter_count(plan.drafters.front());
  const auto one = gpu::checkpoint_bytes(params);
  const auto need = one * static_cast<uint64_t>(plan.checkpointer.keep + 1);
  uint64_t have = gpu::available_bytes(dir);
  if (have == UINT64_MAX)
    return 0;
  for (const auto& c : gpu::list_checkpoints(dir))
    have += gpu::folder_bytes(c);  // replaced as the run rotates
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.path().extension() == ".tmp")
      have += gpu::folder_bytes(e.path());  // a killed write's, removed by the next rotation
  if (have >= need)
    return 0;
  std::fprintf(stderr,
               "tandem run: %s: %scheckpoint.dir %s holds %s (free plus this run's existing checkpoints), "
               "but checkpoint.keep + 1 = %d checkpoints of this drafter (%lld parameters: %s each) need %s%s\n",
               force ? "warning" : "not enough disk space", force ? "(--force) " : "", dir.c_str(),
               gpu::human_bytes(have).c_str(), plan.checkpointer.keep + 1, static_cast<long long>(params),
               gpu::human_bytes(one).c_str(), gpu::human_bytes(need).c_str(),
               force ? "; a checkpoint that does not fit stops the run" 
                     : ". Free space, lower checkpoint.keep, set checkpoint.dir to a larger disk, or pass --force");
  return force ? 0 : 2;
}

/// The members of a cluster run (cluster.listen): the door published on
/// cluster.listen, the agents of the nodes that joined, their devices.
struct leader_side {
  caf::actor door;
  std::shared_ptr<cluster_gate> gate;  ///< the public port (actors/cluster_gate.hpp)
  uint16_t port = 0;
  cluster_members members;
  std::vector<member_devices> joined;  ///< in the placement's order
  /// Tells every member the run ended (they exit with `code`) and waits
  /// for each one's goodbye (at most 5 s each), so the words are not lost
  /// with the connection.
  void end(caf::actor_system& sys, int32_t code) {
    if (!door)
      return;
    caf::scoped_actor self{sys};
    self->request(door, std::chrono::seconds(15), shutdown_atom::value, code)
      .receive([](const std::string&) {}, [](const caf::error&) {});
    door = caf::actor{};
  }
};

/// Publishes the door and waits for every node the placement names, with a
/// progress line; returns nullopt (having said why) on a timeout, a signal
/// or an address it cannot listen on.
std::optional<leader_side> wait_for_members(caf::actor_system& sys, const run_config& cfg,
                                            const std::vector<std::string>& expected, int32_t local_gpus) {
  leader_side out;
  {
    // A killed leader's: its port is not this one's.
    std::error_code ec;
    std::filesystem::remove(cfg.run.output_dir / "cluster.json", ec);
  }
  door_options d;
  d.hello = build_hello(cfg.cluster.name, "", local_gpus);
  d.expected = expected;
  d.leader_holds_actors = placement_uses_leader(cfg);
  if (!cfg.cluster.secret.empty()) {
    std::ifstream in(cfg.cluster.secret);
    std::string hex;
    if (!(in >> hex)) {
      std::fprintf(stderr, "tandem run: cluster.secret %s: cannot read it (tandem certs writes DIR/cluster.secret)\n",
                   cfg.cluster.secret.c_str());
      return std::nullopt;
    }
    try {
      (void)join_token(hex, "check");
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: cluster.secret %s: %s\n", cfg.cluster.secret.c_str(), e.what());
      return std::nullopt;
    }
    d.secret_hex = hex;
  }
  caf::scoped_actor waiter{sys};
  d.listener = caf::actor_cast<caf::actor>(waiter);
  out.door = spawn_door(sys, d);
  const auto a = parse_listen(cfg.cluster.listen);
  // CAF listens on loopback only; the public port is the gate, which lets
  // a peer's bytes through to CAF once it has answered the gate's nonce.
  auto inner = publish_door(sys, out.door, 0, "127.0.0.1", !cfg.cluster.certs.empty());
  if (!inner) {
    std::fprintf(stderr, "tandem run: cannot publish the cluster's door on loopback: %s\n",
                 sys.render(inner.error()).c_str());
    caf::anon_send(out.door, shutdown_atom::value, int32_t{1});
    return std::nullopt;
  }
  try {
    gate_options g;
    g.host = a->host;
    g.port = a->port;
    g.inner_port = *inner;
    g.secret_hex = d.secret_hex;
    out.gate = std::make_shared<cluster_gate>(g);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem run: cluster.listen %s: %s\n", cfg.cluster.listen.c_str(), e.what());
    caf::anon_send(out.door, shutdown_atom::value, int32_t{1});
    return std::nullopt;
  }
  out.port = out.gate->port();
  {
    // Where members join (a port 0 in the config is picked here).
    const nlohmann::json j{{"host", a->host}, {"port", out.port}, {"leader", cfg.cluster.name},
                           {"pid", static_cast<int64_t>(::getpid())}, {"members", expected}};
    try {
      write_atomically(cfg.run.output_dir / "cluster.json", j.dump(2) + "\n", 0644);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: %s\n", e.what());
      caf::anon_send(out.door, shutdown_atom::value, int32_t{1});
      return std::nullopt;
    }
  }
  std::fprintf(stderr, "tandem run: cluster leader '%s' on %s:%u%s (tandem node --join %s:%u --name NAME%s)\n",
               cfg.cluster.name.c_str(), a->host.c_str(), static_cast<unsigned>(out.port),
               cfg.cluster.certs.empty() ? "" : " over TLS", a->host.c_str(), static_cast<unsigned>(out.port),
               cfg.cluster.certs.empty() ? "" : " --certs DIR/NAME");
  std::map<std::string, std::pair<int32_t, node_actor>> up;
  const auto t0 = std::chrono::steady_clock::now();
  std::string last_line;
  auto progress = [&] {
    std::string missing;
    for (const auto& n : expected)
      if (!up.count(n))
        missing += (missing.empty() ? "" : ", ") + n;
    auto line = "waiting for nodes: " + std::to_string(up.size()) + " of " + std::to_string(expected.size())
                + " joined" + (missing.empty() ? std::string() : "; missing: " + missing);
    if (line != last_line)
      std::fprintf(stderr, "tandem run: %s\n", line.c_str());
    last_line = line;
    return missing;
  };
  progress();
  while (up.size() < expected.size()) {
    bool stop = false;
    waiter->receive(
      [&](node_up_atom, const std::string& name, int32_t gpus, const node_actor& agent) {
        if (gpus < 0)
          up.erase(name);
        else
          up[name] = {gpus, agent};
        progress();
      },
      caf::after(std::chrono::milliseconds(250)) >> [&] {
        const double waited = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        if (stop_signal.load() != 0) {
          std::fprintf(stderr, "tandem run: signal %d while waiting for nodes\n", stop_signal.load());
          stop = true;
        } else if (waited > cfg.cluster.join_timeout_s) {
          std::fprintf(stderr, "tandem run: nodes %s did not join within %.0f s (cluster.join_timeout_s): start "
                               "them with tandem node --join %s:%u --name NAME\n",
                       progress().c_str(), cfg.cluster.join_timeout_s, a->host.c_str(),
                       static_cast<unsigned>(out.port));
          stop = true;
        }
      });
    if (stop) {
      out.end(sys, 1);
      return std::nullopt;
    }
  }
  for (const auto& n : expected) {
    out.joined.push_back({n, up[n].first});
    out.members.agents[n] = up[n].second;
  }
  return out;
}

int run_training(const run_options& ro, const worker_context& wc) {
  auto cfg = load_run_config(ro.config, ro.overrides);
  for (const auto& f : ro.faults)
    cfg.faults.push_back(parse_fault(f));
  auto devices = inventory::this_host(static_cast<int32_t>(gpu::query_runtime().devices.size()));
  // Placement first (before any data is prepared): a config that cannot be
  // placed on this host stops here.  Members' devices are checked once they
  // have joined.
  const auto member_names = placement_nodes(cfg);
  std::vector<member_devices> assumed;
  for (const auto& n : member_names)
    assumed.push_back({n, 1 << 20});
  const auto placement = resolve_placement(cfg, devices.nodes.front().gpus, assumed);
  std::fprintf(stderr, "tandem run: %s (run '%s')\n%s", ro.config.c_str(), cfg.run.name.c_str(),
               placement.describe().c_str());

  check_paths(cfg, cfg.data.sources.empty());
  check_host_dir(cfg);
  // The target's config.json, as every engine will read it: what Tandem
  // cannot run, and a context shorter than data.seq_len, stop here (exit 2)
  // rather than once the engines load.
  gpu::qwen3_config target_cfg;
  try {
    target_cfg = gpu::load_qwen3_config(cfg.model.target);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem run: %s: model.target: %s\n", ro.config.c_str(), e.what());
    return 2;
  }
  if (target_cfg.max_position_embeddings < cfg.data.seq_len) {
    std::fprintf(stderr, "tandem run: %s: data.seq_len = %lld is longer than the target's context: %s has "
                         "max_position_embeddings = %lld (lower data.seq_len)\n",
                 ro.config.c_str(), static_cast<long long>(cfg.data.seq_len),
                 (cfg.model.target / "config.json").c_str(),
                 static_cast<long long>(target_cfg.max_position_embeddings));
    return 2;
  }
  if (cfg.model.tap_layers.empty() && target_cfg.num_hidden_layers < 8) {
    std::string ids;
    for (auto id : gpu::training_tap_ids(target_cfg.num_hidden_layers))
      ids += (ids.empty() ? "" : ", ") + std::to_string(id);
    std::fprintf(stderr, "tandem run: model.tap_layers not set: the target has %lld layers, too few for DFlash's "
                         "default of 5 taps spread over layers 1 .. L-3: taps [%s]\n",
                 static_cast<long long>(target_cfg.num_hidden_layers), ids.c_str());
  }
  // An --overwrite start killed before its first checkpoint (by a signal: nothing
  // put its earlier run back) left that run set aside: back it goes, under
  // the folder's lock (taken here when its marker is there), before anything
  // looks for a run.  The parent did so before its first worker; a restarted
  // worker whose predecessor died so is a first start again (--overwrite anew).
  bool locked = wc.folder_locked;
  if (!locked && earlier_run_aside::marker_in(cfg)) {
    if (int rc = lock_run_folder(cfg); rc != 0)
      return rc;
    locked = true;
  }
  bool resume_if_any = wc.resume_if_any;
  const bool recovered_by_parent = wc.folder_locked && !wc.restarted;
  if (locked && !recovered_by_parent && earlier_run_aside::recover(cfg) > 0)
    resume_if_any = false;
  std::string earlier_run;  // what --overwrite removes once the checks have passed
  if (!ro.resume && !resume_if_any)
    if (int rc = check_fresh_start(cfg, ro.overwrite, earlier_run); rc != 0)
      return rc;
  if (const auto args = prepare_arguments(cfg); !args.empty()) {
    std::fprintf(stderr, "tandem run: preparing data.sources into %s\n", cfg.data.path.c_str());
    int rc = run_prepare(args);
    if (rc != 0) {
      std::fprintf(stderr, "tandem run: preparing data.sources (%s) failed with exit status %d\n",
                   ro.config.c_str(), rc);
      return rc == 2 ? 2 : 1;
    }
  }
  // The data set's manifest and shards, opened: what is wrong with them is
  // the config's data.path (exit 2), named with the config file.
  auto open_data = [&]() -> std::optional<gpu::data::dataset> {
    try {
      return gpu::data::dataset(cfg.data.path);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: %s: data.path: %s\n", ro.config.c_str(), e.what());
      return std::nullopt;
    }
  };
  auto opened = open_data();
  if (!opened)
    return 2;
  auto& ds = *opened;
  try {
    // The data set must be the target's (the prefetch actors check it again,
    // and say the warnings): a mismatch stops here, before anything is written.
    (void)gpu::data::check_tokenizer_identity(ds.manifest(), ds.dir() / "manifest.json",
                                              gpu::load_model_tokens(cfg.model.target));
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem run: %s: data.path: %s\n", ro.config.c_str(), e.what());
    return 2;
  }
  // A data set with no supervised token trains nothing: every step would
  // score nothing and the run would end "done" with no loss.  (The count is
  // the manifest's, checked against each shard's mask before its first batch.)
  if (ds.manifest().total_supervised == 0) {
    std::fprintf(stderr, "tandem run: %s: data.path: %s: totals.supervised = 0: every token of its %lld samples is "
                         "masked out of the loss (loss_mask 0): nothing to train on\n",
                 ro.config.c_str(), (ds.dir() / "manifest.json").c_str(), static_cast<long long>(ds.num_samples()));
    return 2;
  }
  // Samples longer than a row are cut to it by the packer (docs/data.md):
  // say how much is never trained on, rather than losing it unseen.
  if (ds.max_sample_length() > cfg.data.seq_len) {
    int64_t cut = 0, lost = 0;
    for (int64_t i = 0; i < ds.num_samples(); ++i)
      if (const auto n = ds.sample_length(i); n > cfg.data.seq_len) {
        ++cut;
        lost += n - cfg.data.seq_len;
      }
    std::fprintf(stderr, "tandem run: warning: %lld of %lld samples are longer than data.seq_len = %lld (the longest "
                         "has %lld tokens): each keeps its first %lld tokens, and %lld tokens (%.1f%% of the data "
                         "set's) are never trained on; raise data.seq_len to keep them\n",
                 static_cast<long long>(cut), static_cast<long long>(ds.num_samples()),
                 static_cast<long long>(cfg.data.seq_len), static_cast<long long>(ds.max_sample_length()),
                 static_cast<long long>(cfg.data.seq_len), static_cast<long long>(lost),
                 100.0 * static_cast<double>(lost) / static_cast<double>(std::max<int64_t>(1, ds.num_tokens())));
  }
  // The schedule's length: the packer's own batch count over every epoch
  // (gpu/data/packer.hpp count_steps), not a fill factor.
  data_facts facts{ds.num_samples(), ds.num_tokens()};
  facts.content_hash = ds.manifest().content_hash;
  {
    gpu::data::packer_options po;
    po.rows = cfg.data.rows;
    po.seq_len = cfg.data.seq_len;
    po.max_docs = cfg.data.max_docs;
    po.lookahead = cfg.data.lookahead;
    const auto t0 = std::chrono::steady_clock::now();
    // A batch's packing plan holds rows x lookahead entries: sizes past memory
    // (or past a vector's max_size) are a config error, not "std::bad_alloc".
    auto too_large = [&] {
      std::fprintf(stderr, "tandem run: %s: data.rows = %lld and data.lookahead = %lld: one batch's packing does "
                           "not fit in memory (the data set has %lld samples); lower them\n",
                   ro.config.c_str(), static_cast<long long>(cfg.data.rows),
                   static_cast<long long>(cfg.data.lookahead), static_cast<long long>(ds.num_samples()));
      return 2;
    };
    gpu::data::step_count counted;
    try {
      counted = gpu::data::count_steps(ds, cfg.data.seed, static_cast<int64_t>(placement.targets.size()),
                                       static_cast<int64_t>(placement.drafters.size()), po, cfg.data.epochs);
    } catch (const std::bad_alloc&) {
      return too_large();
    } catch (const std::length_error&) {
      return too_large();
    }
    facts.steps = counted.steps;
    const double took = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    std::fprintf(stderr, "tandem run: %lld optimizer steps in %lld epochs (%s, %.1f s)\n",
                 static_cast<long long>(counted.steps), static_cast<long long>(cfg.data.epochs),
                 counted.epochs_counted == cfg.data.epochs
                   ? "packed from the sample lengths"
                   : ("the first " + std::to_string(counted.epochs_counted) + " packed, the rest scaled").c_str(),
                 took);
  }
  for (const auto& f : cfg.faults) {
    const auto last = cfg.train.max_steps > 0 ? std::min(cfg.train.max_steps, facts.steps) : facts.steps;
    if (f.role == "drafter" && last > 0 && f.at_step > last)
      std::fprintf(stderr, "tandem run: warning: --fault %s will not fire: the run ends at step %lld\n",
                   f.to_string().c_str(), static_cast<long long>(last));
  }
  // The folders it writes, before anything is trained that would need them
  // (a checkpoint.dir it cannot write was found at the first checkpoint),
  // then the folder's lock — before a --resume looks at its checkpoints,
  // which a run still writing there may be rotating.
  for (const auto& [field, dir] : {std::pair<std::string, std::filesystem::path>{"run.output_dir", cfg.run.output_dir},
                                   {"checkpoint.dir", cfg.checkpoint_dir()}})
    if (auto why = cannot_write(dir)) {
      std::fprintf(stderr, "tandem run: %s: %s = %s: %s\n", ro.config.c_str(), field.c_str(), dir.c_str(),
                   why->c_str());
      return 2;
    }
  if (!locked) {
    if (int rc = lock_run_folder(cfg); rc != 0)
      return rc;
    if (earlier_run_aside::recover(cfg) > 0 && !ro.resume)  // a marker that came after the check above
      if (int rc = check_fresh_start(cfg, ro.overwrite, earlier_run); rc != 0)
        return rc;
  }
  std::optional<resume_point> resume;
  std::optional<resumed_event> resumed;  // the "resumed" event
  const auto host_dir = host_restore_dir(cfg);
  if (ro.resume || resume_if_any) {
    // The newest that verifies of the checkpoints and the restore points in
    // shared memory (those outlive a worker process, not the machine).
    const auto ckpt_dir = cfg.checkpoint_dir();
    std::vector<std::filesystem::path> roots{ckpt_dir};
    if (cfg.checkpoint.host_every > 0)
      roots.push_back(host_dir);
    const auto found = gpu::find_resume_checkpoint(roots);
    for (const auto& w : found.warnings)
      std::fprintf(stderr, "tandem run --resume: warning: %s\n", w.c_str());
    if (auto missing = missing_member_checkpoint(cfg, found.dir)) {
      std::fprintf(stderr, "tandem run --resume: %s%s\n", ro.force ? "warning (--force): " : "", missing->c_str());
      if (!ro.force)
        return 2;
    }
    if (found.dir.empty() && !resume_if_any) {
      std::fprintf(stderr, "tandem run --resume: no complete checkpoint in %s%s\n", ckpt_dir.c_str(),
                   roots.size() > 1 ? (" nor in " + host_dir.string()).c_str() : "");
      return 2;
    }
    if (!found.dir.empty()) {
      nlohmann::json extra;
      try {
        // (Its bytes passed their checksum: a field that does not read here
        // was written by another version, or edited.)
        extra = nlohmann::json::parse(gpu::read_checkpoint_extra(found.dir));
        resume = resume_point{found.dir.string(), extra.at("step").get<int64_t>(), extra.at("ledger").dump(), {}};
        if (extra.contains("lr_scale"))  // set through the control endpoint (absent: never set)
          for (const auto& change : extra.at("lr_scale"))
            resume->lr_scale.emplace_back(change.at(0).get<int64_t>(), change.at(1).get<double>());
      } catch (const std::exception& e) {
        std::fprintf(stderr, "tandem run --resume: %s: field 'extra' (the run's step, ledger and learning-rate "
                             "schedule) does not read: %s; move that checkpoint folder aside to resume from the "
                             "one before it\n",
                     (found.dir / "state.json").c_str(), e.what());
        return 2;
      }
      if (int rc = check_resumed_data(extra, facts, cfg, found.dir, ro.force); rc != 0)
        return rc;
      // A change made after this checkpoint (the schedule as last set is
      // kept beside metrics.jsonl): the newer schedule holds the older.
      if (auto kept = read_lr_schedule(cfg.lr_schedule_file()); kept && *kept != resume->lr_scale) {
        std::fprintf(stderr, "the learning-rate multiplier's schedule from %s (set through the control endpoint "
                             "after this checkpoint)\n", cfg.lr_schedule_file().c_str());
        resume->lr_scale = std::move(*kept);
      }
      const bool host = found.dir.parent_path() == host_dir;
      resume->on_disk = !host;
      const auto disk = gpu::list_checkpoints(ckpt_dir);
      resumed = resumed_event{resume->step, found.dir.string(), host ? "host" : "disk",
                              disk.empty() ? int64_t{-1} : std::stoll(disk.front().filename().string().substr(5)),
                              unix_now()};
      const auto last = cfg.train.max_steps > 0 ? std::min(cfg.train.max_steps, facts.steps) : facts.steps;
      if (ro.resume && !resume_if_any && resume->step >= last && ended_at(cfg, resume->step)) {
        const bool by_max = cfg.train.max_steps > 0 && cfg.train.max_steps <= facts.steps;
        std::fprintf(stderr, "tandem run --resume: %s already ended at step %lld, its last (%s): nothing to "
                             "train.  To train on, raise %s, or start again with --overwrite\n",
                     cfg.run.output_dir.c_str(), static_cast<long long>(resume->step),
                     by_max ? ("train.max_steps = " + std::to_string(cfg.train.max_steps)).c_str()
                            : ("data.epochs = " + std::to_string(cfg.data.epochs)).c_str(),
                     by_max ? "train.max_steps" : "data.epochs (the learning-rate schedule stretches with it)");
        return 0;
      }
      std::fprintf(stderr, "resuming from %s (step %lld%s)\n", found.dir.c_str(),
                   static_cast<long long>(resume->step),
                   host ? ", a restore point in shared memory: newer than the newest checkpoint" : "");
    } else {
      std::fprintf(stderr, "tandem run: nothing to resume from yet: starting from step 0\n");
    }
  }
  earlier_run_aside overwritten;
  if (!earlier_run.empty())
    overwritten.set_aside(cfg, earlier_run);
  if (const auto jsonl = cfg.metrics_file(); !jsonl.empty()) {
    // The run's record (its events, its end): a run that cannot write it
    // does not start (the metrics actor would only log that it writes none).
    std::error_code ec;
    std::filesystem::create_directories(jsonl.parent_path(), ec);
    const int fd = ::open(jsonl.c_str(), O_WRONLY | O_APPEND | O_CREAT | O_CLOEXEC, 0644);
    if (fd < 0) {
      std::fprintf(stderr, "tandem run: %s: 'metrics.jsonl' = \"%s\": cannot write it: %s\n", ro.config.c_str(),
                   jsonl.c_str(), std::strerror(errno));
      return 2;
    }
    ::close(fd);
  }
  {
    std::ofstream f(cfg.run.output_dir / "config.toml");
    f << to_toml(cfg);
  }
  if (!ro.resume && !resume_if_any) {
    // A fresh start: a schedule kept by an earlier run in this folder is not
    // this run's, nor are the faults its cluster members fired.
    std::error_code ec;
    std::filesystem::remove(cfg.lr_schedule_file(), ec);
    for (const auto& e : std::filesystem::directory_iterator(cfg.run.output_dir, ec))
      if (e.path().filename().string().rfind("faults-fired-", 0) == 0)
        std::filesystem::remove(e.path(), ec);
  }
  // The actor system comes before the plan: a cluster's leader needs it to
  // take its members' joins, and the plan their devices.
  const bool cluster = !cfg.cluster.listen.empty();
  caf::actor_system_config sys_cfg;
  if (cluster)
    configure_cluster_system(sys_cfg, cfg.cluster.heartbeat_s, cfg.cluster.timeout_s, cfg.cluster.certs.string());
  else
    register_messages(sys_cfg);
  caf::actor_system sys{sys_cfg};
  std::optional<leader_side> leader;
  if (cluster) {
    std::signal(SIGINT, on_signal);  // while it waits for members, too
    std::signal(SIGTERM, on_signal);
    std::signal(SIGHUP, on_signal);  // a closed terminal or ssh session: stop as SIGTERM does
    // Batches and features go to members on this host through shared memory.
    gpu::transport::share_with_host(true);
    if (const auto n = gpu::transport::sweep_orphan_segments())
      std::fprintf(stderr, "tandem run: removed %zu shared-memory segment(s) of dead processes\n", n);
    leader = wait_for_members(sys, cfg, member_names, devices.nodes.front().gpus);
    if (!leader)
      return 1;
    devices.nodes.front().name = cfg.cluster.name;
    for (const auto& m : leader->joined)
      devices.nodes.push_back({m.name, m.gpus});
  }
  // A failure from here on tells the members, so they do not wait for a
  // leader that is gone.
  struct end_members {
    caf::actor_system& sys;
    std::optional<leader_side>& leader;
    int32_t code = 1;
    ~end_members() {
      if (leader)
        leader->end(sys, code);
    }
  } members_end{sys, leader};
  auto plan = make_plan(cfg, devices, facts, resume);
  if (plan.cluster) {
    // Payloads to members on other hosts (or, forced, to any member) over NCCL links.
    gpu::transport::force_links(plan.cluster->force_links);
    gpu::transport::name_nccl_host(cfg.cluster.name, plan.cluster->force_links);
    gpu::transport::set_link_timeout(
      std::chrono::milliseconds(static_cast<int64_t>(plan.cluster->link_timeout_s * 1000)));
  }
  if (!resume && resume_if_any)
    if (auto kept = read_lr_schedule(cfg.lr_schedule_file())) {
      // A worker restarted before the first checkpoint: step 0 again, with
      // the multiplier as it was set.
      std::fprintf(stderr, "the learning-rate multiplier's schedule from %s\n", cfg.lr_schedule_file().c_str());
      plan.coordinator.resume_lr_scale = std::move(*kept);
    }
  plan.faults_fired_file = wc.fired_file;
  if (plan.eval) {
    // [eval]: the held-out conversations rendered with the chat template
    // by the same code as the data (tandem prepare --prompts-out).
    const auto rendered = cfg.run.output_dir / "eval-prompts.jsonl";
    if (int rc = run_prepare(eval_prompt_arguments(cfg, rendered)); rc != 0) {
      std::fprintf(stderr, "tandem run: rendering eval.prompts (%s) failed with exit status %d\n",
                   cfg.eval.prompts.c_str(), rc);
      return rc == 2 ? 2 : 1;
    }
    read_prompt_file(rendered.string(), plan.eval->prompts, plan.eval->stop_ids);
    add_generation_eos(cfg.model.target.string(), plan.eval->stop_ids);
    size_t dropped_for_context = 0;
    {
      // A prompt that with eval.max_new_tokens would pass the target's context is
      // left out (said once), not an error in every evaluation.
      const int64_t context = target_cfg.max_position_embeddings;
      auto& ps = plan.eval->prompts;
      const auto before = ps.size();
      if (context > 0)
        ps.erase(std::remove_if(ps.begin(), ps.end(),
                                [&](const std::vector<int64_t>& p) {
                                  return static_cast<int64_t>(p.size()) + plan.eval->max_new_tokens > context;
                                }),
                 ps.end());
      dropped_for_context = before - ps.size();
      if (ps.size() != before)
        std::fprintf(stderr, "tandem run: eval: warning: %zu of %zu prompts of %s left out: with eval.max_new_tokens = "
                             "%lld they would run past the target's context (max_position_embeddings = %lld)\n",
                     before - ps.size(), before, cfg.eval.prompts.c_str(),
                     static_cast<long long>(plan.eval->max_new_tokens), static_cast<long long>(context));
    }
    if (plan.eval->prompts.empty()) {
      std::fprintf(stderr, "tandem run: %s: eval.prompts (%s) %s\n", ro.config.c_str(), cfg.eval.prompts.c_str(),
                   dropped_for_context > 0 ? "has no prompt left that fits the target's context with "
                                             "eval.max_new_tokens (lower it, or give shorter prompts)"
                                           : "holds no conversation with an assistant turn");
      return 2;
    }
    std::fprintf(stderr, "tandem run: eval: %zu held-out prompts, on %s%s\n", plan.eval->prompts.size(),
                 device_string(plan.eval->device).c_str(),
                 cfg.eval.every_steps > 0 ? (", every " + std::to_string(cfg.eval.every_steps) + " steps").c_str()
                                          : "");
  }
  prepare_host_tier(plan, !resume && !ro.resume && !resume_if_any);
  // A new worker of the same run was checked when the run started (and its
  // predecessor's files take space it will reuse).
  if (int rc = check_checkpoint_space(plan, ro.force || resume_if_any); rc != 0)
    return rc;
  {
    std::set<int32_t> used;
    for (const auto& t : plan.targets)
      used.insert(t.device);
    for (const auto& d : plan.drafters)
      used.insert(d.device);
    if (plan.eval)
      used.insert(plan.eval->device);
    for (auto d : used)
      gpu::set_memory_fraction(d, plan.gpu_memory_fraction);
  }

  if (plan.control)
    plan.control->config_toml = to_toml(cfg);

  if (leader) {
    // Every member computes the same plan from the same facts.
    node_setup setup;
    setup.leader = cfg.cluster.name;
    setup.config_toml = to_toml(cfg);
    for (const auto& n : devices.nodes) {
      setup.node_names.push_back(n.name);
      setup.node_gpus.push_back(n.gpus);
    }
    setup.num_samples = ds.num_samples();
    setup.num_tokens = ds.num_tokens();
    setup.schedule_steps = facts.steps;
    if (resume) {
      setup.resume_checkpoint = resume->checkpoint;
      setup.resume_step = resume->step;
      setup.resume_ledger = resume->ledger;
    }
    // Through the door, which gives the plan to every member up now and to
    // one that joins again later.
    caf::scoped_actor asker{sys};
    std::string failed;
    std::vector<std::string> spares, drafter_nodes;
    for (const auto& sp : plan.placement.spares)
      spares.push_back(sp.node + ":" + (sp.device < 0 ? std::string("cpu") : "cuda:" + std::to_string(sp.device)));
    for (const auto& d : plan.placement.drafters)
      drafter_nodes.push_back(d.node);
    asker->request(leader->door, std::chrono::seconds(90), setup_atom::value, setup, cfg.cluster.join_timeout_s,
                   spares, drafter_nodes)
      .receive([](const std::string&) {}, [&](caf::error& e) { failed = sys.render(e); });
    if (!failed.empty()) {
      std::fprintf(stderr, "tandem run: %s\n", failed.c_str());
      return 1;
    }
    leader->members.door = leader->door;
    leader->members.rejoin_timeout_s = cfg.cluster.join_timeout_s;
  }
  running_system run;
  try {
    run = spawn_system(sys, plan, leader ? leader->members : cluster_members{});
  } catch (const std::runtime_error& e) {
    std::fprintf(stderr, "tandem run: %s: %s\n", ro.config.c_str(), e.what());
    return 2;
  }
  // --overwrite: the earlier run goes once this one has a checkpoint of its
  // own (in checkpoint.dir, or a "checkpoint" event: a member's disk) — a
  // start killed before that leaves nothing to resume, so the next start
  // puts the earlier run back.
  std::streamoff metrics_read = 0;
  auto discard_once_checkpointed = [&] {
    if (!overwritten.pending())
      return;
    bool checkpointed = !gpu::list_checkpoints(cfg.checkpoint_dir()).empty();
    if (!checkpointed && !cfg.metrics_file().empty()) {
      std::ifstream in(cfg.metrics_file());
      in.seekg(metrics_read);
      for (std::string line; !checkpointed && std::getline(in, line) && !in.eof();) {  // whole lines only
        metrics_read += static_cast<std::streamoff>(line.size()) + 1;
        checkpointed = line.find("\"event\":\"checkpoint\"") != std::string::npos;
      }
    }
    if (checkpointed)
      overwritten.discard();
  };
  const auto control_file = cfg.run.output_dir / "control.json";
  if (run.control_http) {
    try {
      write_control_file(control_file, plan.control->host, run.control_http->port(), run.control_token,
                         cfg.run.name, !plan.control->tls_cert.empty());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "tandem run: warning: %s: tandem shell cannot find the endpoint\n", e.what());
    }
    std::fprintf(stderr, "tandem run: control endpoint %s://%s:%u (tandem shell %s)\n",
                 plan.control->tls_cert.empty() ? "http" : "https", plan.control->host.c_str(),
                 static_cast<unsigned>(run.control_http->port()), cfg.run.output_dir.c_str());
  }
  if (wc.restarted)
    caf::anon_send(run.peers.metrics, run_event{*wc.restarted});
  if (resumed) {
    resumed->unix_s = unix_now();  // beside the line's time_s, the two clocks' offset
    caf::anon_send(run.peers.metrics, run_event{*resumed});
  }
  std::signal(SIGINT, on_signal);
  std::signal(SIGTERM, on_signal);
  std::signal(SIGHUP, on_signal);  // a closed terminal or ssh session: stop as SIGTERM does
  caf::scoped_actor self{sys};
  start_run(sys, run, caf::actor_cast<caf::actor>(self));
  int exit_code = 0;
  bool done = false;
  bool stop_sent = false;
  while (!done) {
    self->receive(
      [&](const run_summary& s) {
        done = true;
        std::string tau;
        if (s.eval_step >= 0) {
          char buf[96];
          std::snprintf(buf, sizeof buf, "; tau %.3f (real, at step %lld)", s.eval_tau,
                        static_cast<long long>(s.eval_step));
          tau = buf;
        }
        char loss[96];
        if (s.first_loss == 0 && s.last_loss == 0)  // only steps that scored tokens set them
          std::snprintf(loss, sizeof loss, "no loss (no step of this process scored a token)");
        else
          std::snprintf(loss, sizeof loss, "loss %.4f -> %.4f", s.first_loss, s.last_loss);
        std::fprintf(stderr, "tandem run: %s after %lld steps (%lld epochs complete); %s%s; checkpoint %s\n",
                     s.stop_reason.c_str(), static_cast<long long>(s.steps),
                     static_cast<long long>(s.epochs_completed), loss, tau.c_str(),
                     s.checkpoint.empty() ? "(none)" : s.checkpoint.c_str());
      },
      [&](const caf::error& err) {
        done = true;
        exit_code = 1;
        std::fprintf(stderr, "tandem run failed: %s\n", sys.render(err).c_str());
        if (err.category() == error_category && err.code() == static_cast<uint8_t>(errc::device_lost)) {
          exit_code = device_lost_status;
          std::fprintf(stderr, "tandem run: a device's CUDA context is lost: this worker process exits with "
                               "status %d (its parent starts a new one from the newest restore point)\n",
                       device_lost_status);
          // Tearing down on a poisoned context may block in the driver:
          // the restore points are already what they are.
          std::thread([] {
            std::this_thread::sleep_for(std::chrono::seconds(20));
            std::fflush(nullptr);
            std::_Exit(device_lost_status);
          }).detach();
        }
      },
      caf::after(std::chrono::milliseconds(200)) >> [&] {
        discard_once_checkpointed();
        if (stop_signal.load() != 0 && !stop_sent) {
          stop_sent = true;
          std::fprintf(stderr, plan.checkpoint_on_signal
                                 ? "\ntandem run: signal %d: finishing the step and writing a checkpoint\n"
                                 : "\ntandem run: signal %d: finishing the step (checkpoint.on_signal = "
                                   "false: no checkpoint)\n",
                       stop_signal.load());
          request_stop(run);
        }
      });
  }
  shutdown_system(run);
  // The run's record: its last lines (the end) are in the metrics actor's
  // mailbox; they are on disk, and the file closed, once it is gone.
  // Nothing after this point (a crash in teardown included) can lose them.
  self->wait_for(run.peers.metrics);
  if (exit_code == 0)
    overwritten.discard();  // ended well, checkpoint or not: this run is the folder's now
  else
    discard_once_checkpointed();
  members_end.code = exit_code;
  if (run.control_http)
    ::unlink(control_file.c_str());  // the endpoint is gone
  if (exit_code == 0 && plan.coordinator.host_every > 0) {
    // Everything trained is in a checkpoint: the restore points in shared
    // memory (RAM) are no longer needed.  The host checkpointer may still be
    // writing the last one: removing the folder under it would leave that
    // one behind.
    if (run.peers.host_checkpointer)
      self->wait_for(run.peers.host_checkpointer);
    gpu::remove_checkpoints(plan.host_checkpointer.dir);
  }
  // tests/integration/worker_test.sh: a crash in teardown, after the end.
  if (exit_code == 0 && std::getenv("TANDEM_TEST_ABORT_AT_EXIT") != nullptr)
    std::abort();
  return exit_code;
}

/// run_training with its errors as exit statuses (2: the config or its
/// files, 1: anything else), then the worker process's end: its stdio
/// flushed and _Exit.  When run_training returns, its actors are gone and
/// everything the run keeps is written and closed; what is left is the
/// process's static teardown (LibTorch's and CUDA's, CAF's threads ending),
/// whose order is not ours and which has nothing to save.
[[noreturn]] void run_worker(const run_options& ro, const worker_context& wc) {
  report_crashes("tandem run (worker)");
  int code = 1;
  try {
    code = run_training(ro, wc);
  } catch (const config_error& e) {
    std::fprintf(stderr, "tandem run: %s\n", e.what());
    code = 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem run: %s\n", e.what());
    code = 1;
  }
  gpu::transport::unlink_own_segments();  // the atexit handler _Exit skips (a cluster leader's)
  std::fflush(nullptr);
  std::_Exit(code);
}

std::atomic<int> parent_signal{0};
std::atomic<pid_t> worker_pid{0};

/// Forwards SIGINT/SIGTERM to the worker (kill is async-signal-safe); the
/// worker finishes its step and checkpoints as a single process would.
extern "C" void on_parent_signal(int sig) {
  parent_signal.store(sig);
  if (const pid_t w = worker_pid.load(); w > 0)
    ::kill(w, sig);
}

std::string describe_exit(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    const char* name = ::strsignal(sig);
    return "signal " + std::to_string(sig) + (name ? std::string(" (") + name + ")" : std::string());
  }
  return "status " + std::to_string(WEXITSTATUS(status));
}

/// After the last worker ended abnormally: a run record it could not close
/// is closed — an "end" event (reason "error") when metrics.jsonl's last
/// record is not one (the worker died, or failed before its metrics actor
/// wrote), and control.json removed when the dead worker wrote it (the
/// shell would otherwise call an endpoint nobody serves).
void close_run_record(const run_config& cfg, pid_t worker, const std::string& why) {
  const auto control = cfg.run.output_dir / "control.json";
  if (std::ifstream in(control); in) {
    const auto j = nlohmann::json::parse(in, nullptr, false);
    if (j.is_object() && j.value("pid", int64_t{-1}) == static_cast<int64_t>(worker)) {
      std::error_code ec;
      std::filesystem::remove(control, ec);
    }
  }
  const auto jsonl = cfg.metrics_file();
  std::error_code ec;
  if (jsonl.empty() || !std::filesystem::exists(jsonl, ec))
    return;
  const auto j = nlohmann::json::parse(jsonl_last_line(jsonl), nullptr, false);
  if (j.is_object() && j.value("event", "") == "end")
    return;
  try {
    jsonl_log log;
    log.open(jsonl);
    nlohmann::json end{{"event", "end"}, {"reason", "error"}, {"error", why + "; its own last words are on stderr"},
                       {"unix_s", unix_now()}, {"written_by", "tandem run (the parent)"}};
    if (!cfg.run.name.empty())
      end["run"] = cfg.run.name;
    if (!log.append(end.dump()))
      std::fprintf(stderr, "tandem run: cannot write the run's end to %s: %s\n", jsonl.c_str(), log.trouble().c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "tandem run: cannot write the run's end: %s\n", e.what());
  }
}

/// The parent: forks a worker, waits for it, forwards SIGINT/SIGTERM to it,
/// and starts a new one (resuming from the newest restore point) after a
/// death by a signal or exit status 75, up to supervision.worker_restarts
/// times.  Returns the exit status of the run.
int supervise_workers(const run_options& ro) {
  int64_t budget = 3;
  run_config cfg;
  try {
    cfg = load_run_config(ro.config, ro.overrides);
    budget = cfg.supervision.worker_restarts;
  } catch (const config_error& e) {
    std::fprintf(stderr, "tandem run: %s\n", e.what());
    return 2;
  }
  if (budget <= 0)
    run_worker(ro, {});
  worker_context wc;
  // The folder's lock, held from here to the last worker's end (a worker
  // restart leaves no moment another run could take the folder).
  if (auto why = cannot_write(cfg.run.output_dir)) {
    std::fprintf(stderr, "tandem run: %s: run.output_dir = %s: %s\n", ro.config.c_str(),
                 cfg.run.output_dir.c_str(), why->c_str());
    return 2;
  }
  if (int rc = lock_run_folder(cfg); rc != 0)
    return rc;
  wc.folder_locked = true;
  earlier_run_aside::recover(cfg);  // before metrics_from below reads the run's record
  wc.fired_file = (std::filesystem::temp_directory_path()
                   / ("tandem-faults-fired-" + std::to_string(::getpid())))
                    .string();
  std::filesystem::remove(wc.fired_file);
  struct sigaction sa {};
  sa.sa_handler = on_parent_signal;
  sigemptyset(&sa.sa_mask);
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  ::sigaction(SIGHUP, &sa, nullptr);
  const pid_t parent = ::getpid();
  // An end counts for a dead worker only if this invocation's workers wrote
  // it (a --resume with more to train follows an earlier end).
  const auto metrics_from = cfg.metrics_file().empty()
                              ? std::streamoff{0}
                              : static_cast<std::streamoff>(jsonl_complete_size(cfg.metrics_file()));
  int status = 0;
  int64_t restarts_done = 0;
  pid_t last_child = 0;
  for (int64_t restarts = 0;; ++restarts) {
    restarts_done = restarts;
    std::fflush(nullptr);
    const pid_t child = ::fork();
    if (child < 0) {
      std::perror("tandem run: fork");
      return 1;
    }
    if (child == 0) {
      // The worker dies with its parent (a SIGKILL of `tandem run` stops
      // the whole run), and handles its own signals (run_training).
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (::getppid() != parent)
        std::_Exit(1);
      std::signal(SIGINT, SIG_DFL);
      std::signal(SIGTERM, SIG_DFL);
      std::signal(SIGHUP, SIG_DFL);
      run_worker(ro, wc);
    }
    worker_pid.store(child);
    last_child = child;
    if (const int sig = parent_signal.load(); sig != 0)
      ::kill(child, sig);  // it came before the worker existed
    while (::waitpid(child, &status, 0) < 0)
      if (errno != EINTR) {
        std::perror("tandem run: waitpid");
        return 1;
      }
    worker_pid.store(0);
    const bool died = WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) == device_lost_status);
    if (!died || parent_signal.load() != 0)
      break;
    const auto how = describe_exit(status);
    if (const auto end = clean_end_step(cfg, metrics_from)) {
      // Dead after this invocation's end of the run and its last
      // checkpoint: a crash in teardown.  A new worker would only load everything to end again.
      std::fprintf(stderr, "tandem run: the worker process ended (%s) after the run had ended at step %lld, "
                           "checkpointed: nothing is lost and nothing is left to do.  A crash in teardown is a "
                           "bug in Tandem: please report it with the stack printed above\n",
                   how.c_str(), static_cast<long long>(*end));
      status = 0;
      break;
    }
    if (restarts >= budget) {
      std::fprintf(stderr, "tandem run: the worker process ended (%s) after %lld restarts "
                           "(supervision.worker_restarts = %lld): giving up; `tandem run --resume` continues "
                           "from the newest restore point\n",
                   how.c_str(), static_cast<long long>(restarts), static_cast<long long>(budget));
      std::filesystem::remove(wc.fired_file);
      close_run_record(cfg, child, "the worker process ended (" + how + ") after " + std::to_string(restarts)
                                     + " restarts (supervision.worker_restarts): giving up");
      return 1;
    }
    std::fprintf(stderr, "tandem run: the worker process ended (%s): starting a new one (restart %lld of %lld), "
                         "resuming from the newest restore point\n",
                 how.c_str(), static_cast<long long>(restarts + 1), static_cast<long long>(budget));
    wc.resume_if_any = true;
    wc.restarted = worker_restarted_event{how, restarts + 1, budget, unix_now()};
  }
  std::filesystem::remove(wc.fired_file);
  if (status != 0 && (restarts_done > 0 || WIFSIGNALED(status)))  // (a first worker that refused to start wrote nothing)
    close_run_record(cfg, last_child, "the worker process ended (" + describe_exit(status) + ")");
  if (WIFSIGNALED(status))
    return 128 + WTERMSIG(status);
  return WEXITSTATUS(status);
}

} // namespace

void add_run(CLI::App& app, int& exit_code) {
  auto* cmd = app.add_subcommand("run", "Train a drafter on this host (CPU or its GPUs) from a TOML config.  The "
                                         "training runs in a worker process, started again from the newest "
                                         "restore point when it dies by a signal or loses its CUDA context "
                                         "(exit 75) before the run has ended, up to supervision.worker_restarts times");
  auto opts = std::make_shared<run_options>();
  cmd->add_option("config", opts->config, "Run configuration (config/README.md)")->required();
  auto* resume = cmd->add_flag("--resume", opts->resume,
                "Continue from the newest complete checkpoint of this run, or from its newest restore point in "
                "shared memory (checkpoint.host_dir) when that is newer (each one is verified; a corrupt one is "
                "moved aside as <name>.corrupt and the previous one is used, with a warning)");
  cmd->add_flag("--overwrite", opts->overwrite,
                "Start from step 0 in a run folder that holds an earlier run (without it, that is refused: "
                "--resume continues it); removes its checkpoints, metrics.jsonl and event files first, keeps "
                "prepared data")
    ->excludes(resume);  // together, --resume won and --overwrite was ignored without a word
  cmd->add_flag("--force", opts->force,
                "Start even when checkpoint.dir's disk cannot hold checkpoint.keep + 1 checkpoints; with --resume, "
                "also when the newest checkpoint is on a cluster member's disk this machine cannot read");
  cmd->add_option("--set", opts->overrides, "Override a field: section.key=value (repeatable)");
  cmd->add_option("--listen", opts->listen,
                  "Lead a cluster: take member nodes (tandem node --join) on HOST:PORT (cluster.listen; off "
                  "loopback only with cluster.certs) and wait for the nodes the placement names");
  cmd->add_option("--name", opts->name, "This leader's node name (cluster.name, default \"leader\")");
  cmd->add_option("--fault", opts->faults,
                  "Inject a fault: drafter=N,kind=K,at_step=S (repeatable; once per run, however many worker "
                  "processes it takes; steps count from 1).  K: throw, nan, hang, slow_snapshot, throw_in_snapshot, "
                  "cuda_error (a non-sticky CUDA error), cuda_sticky (an illegal address: the worker process "
                  "restarts), abort (the worker process aborts).  Or target=N / prefetch=N with kind throw or "
                  "abort, at_step its at_step-th batch");
  cmd->callback([opts, &exit_code] {
    if (!opts->listen.empty())
      opts->overrides.push_back("--listen=" + opts->listen);
    if (!opts->name.empty())
      opts->overrides.push_back("--name=" + opts->name);
    exit_code = supervise_workers(*opts);
  });
}

} // namespace tandem::cli
