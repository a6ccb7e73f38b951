#include "gpu/engine/checkpoint_io.hpp"
#include "gpu/engine/checkpoint.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <algorithm>
#include <fstream>
#include <tuple>
#include <sstream>
#include <set>

#include <csignal>
#include <cstdlib>

#include <fcntl.h>
#include <ftw.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "gpu/engine/crc32c.hpp"
#include "gpu/io/parallel.hpp"
#include "gpu/engine/drafter_engine.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The CRC-32C (hex) of each tensor's bytes, in the map's order, several
/// tensors at a time (a drafter's 12.6 GB at 8B).
std::vector<std::string> tensor_crcs(const std::map<std::string, at::Tensor>& tensors) {
  std::vector<const at::Tensor*> list;
  for (const auto& kv : tensors)
    list.push_back(&kv.second);
  std::vector<std::string> out(list.size());
  io::parallel_for(list.size(), io::copy_threads(), [&](size_t i) {
    const auto c = list[i]->contiguous();
    out[i] = crc32c_hex(crc32c(c.data_ptr(), static_cast<size_t>(c.numel()) * c.element_size()));
  });
  return out;
}

[[noreturn]] void fail(const fs::path& p, const std::string& what) {
  throw error(errc::bad_input, p.string() + ": " + what);
}

std::string errno_text() {
  return std::strerror(errno);
}

/// Deletes `p` and everything below it (no error when it is absent).  Not
/// std::filesystem::remove_all: libtorch.so exports its own copy, built
/// against a newer libstdc++ (see tests/unit/files.hpp).
void remove_tree(const fs::path& p) {
  ::nftw(
    p.c_str(), [](const char* f, const struct stat*, int, struct FTW*) { return ::remove(f); }, 16,
    FTW_DEPTH | FTW_PHYS);
}

/// The step in a checkpoint folder's name (checkpoint_name), or -1.
int64_t step_of(const fs::path& dir) {
  const auto name = dir.filename().string();
  if (name.rfind("step-", 0) != 0 || name.size() == 5)
    return -1;
  int64_t k = 0;
  for (size_t i = 5; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9' || k > (int64_t{1} << 55))
      return -1;
    k = k * 10 + (name[i] - '0');
  }
  return k;
}

/// Fault injection for the crash tests (tests/unit/checkpoint_files_test.cpp,
/// tests/integration/checkpoint_test.sh): TANDEM_CHECKPOINT_CRASH=POINT or
/// POINT:STEP kills the process with SIGKILL when a checkpoint write reaches
/// POINT (of a checkpoint of step STEP or later: which steps are written
/// depends on how fast the writes are, checkpoints coalesce).  Points, in
/// write order:
/// weights (weights.safetensors written in the .tmp folder), optimizer,
/// state (state.json written, before its fsync), before_swap (the .tmp
/// folder complete and durable), after_swap (in place, `latest` not yet
/// updated), after_latest.
void crash_point(const char* point, const fs::path& dir) {
  const char* want = std::getenv("TANDEM_CHECKPOINT_CRASH");
  if (want == nullptr || *want == '\0')
    return;
  const std::string w = want;
  const auto colon = w.find(':');
  const auto name = w.substr(0, colon);
  static const std::set<std::string> points{"weights", "optimizer", "state", "before_swap", "after_swap",
                                            "after_latest"};
  const auto step_text = colon == std::string::npos ? std::string("0") : w.substr(colon + 1);
  if (!points.count(name) || step_text.empty() || step_text.size() > 18 || step_text.find_first_not_of("0123456789") != std::string::npos)
    throw error(errc::bad_input, "TANDEM_CHECKPOINT_CRASH='" + w + "' is not POINT or POINT:STEP (points: weights, "
                                 "optimizer, state, before_swap, after_swap, after_latest)");
  if (name != point)
    return;
  if (step_of(dir) < std::stoll(step_text))
    return;
  std::fprintf(stderr, "TANDEM_CHECKPOINT_CRASH: killed at '%s' writing %s\n", point, dir.c_str());
  std::fflush(stderr);
  std::raise(SIGKILL);
}

/// Writes `text` to `p` and fsyncs it (`crash`: the crash point just before
/// the fsync, or nullptr).
void write_synced(const fs::path& p, const std::string& text, const char* crash = nullptr,
                  const fs::path& crash_dir = {}, bool durable = true) {
  const int fd = ::open(p.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(p, "cannot create: " + errno_text());
  size_t done = 0;
  while (done < text.size()) {
    const auto n = ::write(fd, text.data() + done, text.size() - done);
    if (n < 0) {
      if (errno == EINTR)
        continue;
      const auto e = errno_text();
      ::close(fd);
      fail(p, "cannot write: " + e);
    }
    done += static_cast<size_t>(n);
  }
  if (crash != nullptr)
    crash_point(crash, crash_dir);
  if (durable && ::fsync(fd) != 0) {
    const auto e = errno_text();
    ::close(fd);
    fail(p, "cannot fsync: " + e);
  }
  if (::close(fd) != 0)
    fail(p, "cannot close: " + errno_text());
}

/// Makes the entries of directory `d` durable.
void fsync_dir(const fs::path& d) {
  const int fd = ::open(d.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0)
    fail(d, "cannot open directory to fsync: " + errno_text());
  const int rc = ::fsync(fd);
  const auto e = errno_text();
  ::close(fd);
  if (rc != 0)
    fail(d, "cannot fsync directory: " + e);
}

/// `tmp` (complete, durable) becomes `dir`; an existing `dir` is replaced.
void swap_into_place(const fs::path& tmp, const fs::path& dir) {
  std::error_code ec;
  if (!fs::exists(dir, ec)) {
    if (::rename(tmp.c_str(), dir.c_str()) != 0)
      fail(dir, "cannot rename " + tmp.string() + " to it: " + errno_text());
    return;
  }
  // Linux: swap both names in one step, so `dir` always names a complete
  // checkpoint; then drop the old one (now at `tmp`).
  if (::renameat2(AT_FDCWD, tmp.c_str(), AT_FDCWD, dir.c_str(), RENAME_EXCHANGE) == 0) {
    remove_tree(tmp);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP)
    fail(dir, "cannot exchange with " + tmp.string() + ": " + errno_text());
  // A file system without RENAME_EXCHANGE: move the old one aside first (a
  // crash between the two renames leaves both complete, as `dir`.old and
  // `dir`.tmp).
  const fs::path old = dir.string() + ".old";
  remove_tree(old);
  if (::rename(dir.c_str(), old.c_str()) != 0)
    fail(dir, "cannot move aside to " + old.string() + ": " + errno_text());
  if (::rename(tmp.c_str(), dir.c_str()) != 0)
    fail(dir, "cannot rename " + tmp.string() + " to it: " + errno_text());
  remove_tree(old);
}

fs::path without_trailing_slash(fs::path p) {
  if (!p.empty() && p.filename().empty())
    p = p.parent_path();
  return p;
}

json read_state(const fs::path& dir) {
  const auto file = dir / "state.json";
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))
    fail(file, "missing (not a Tandem drafter checkpoint?)");
  std::ifstream in(file, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  if (!in)
    fail(file, "cannot read");
  try {
    auto j = json::parse(text.str());
    if (!j.is_object())
      fail(file, "not a JSON object");
    return j;
  } catch (const json::exception& e) {
    fail(file, std::string("not valid JSON: ") + e.what());
  }
}

/// j[key], checked to exist and to satisfy `ok`; errors name file and field.
const json& field(const json& j, const std::string& key, bool (json::*ok)() const noexcept,
                  const char* kind, const fs::path& file, const std::string& path = "") {
  const auto name = path.empty() ? key : path + "." + key;
  if (!j.contains(key))
    fail(file, "field '" + name + "' is missing");
  const auto& v = j.at(key);
  if (!(v.*ok)())
    fail(file, "field '" + name + "' must be " + kind + ", is " + v.dump());
  return v;
}

at::Tensor need_f32(const std::map<std::string, at::Tensor>& t, const std::string& name,
                    const fs::path& file) {
  auto it = t.find(name);
  if (it == t.end())
    fail(file, "tensor '" + name + "' is missing");
  if (it->second.scalar_type() != at::kFloat)
    fail(file, "tensor '" + name + "' has dtype " + c10::toString(it->second.scalar_type())
                 + ", expected float32");
  return it->second;
}

} // namespace

transport::handle publish_snapshot(const snapshot_parts& parts) {
  transport::payload p;
  auto bytes = at::empty({static_cast<int64_t>(parts.state.size())}, at::kByte);
  std::memcpy(bytes.data_ptr<uint8_t>(), parts.state.data(), parts.state.size());
  p.tensors.push_back(bytes);
  p.tensors.push_back(parts.step);
  for (const auto* list : {&parts.weights, &parts.exp_avg, &parts.exp_avg_sq})
    p.tensors.insert(p.tensors.end(), list->begin(), list->end());
  return transport::publish(std::move(p));
}

namespace {

/// A snapshot's tensors, its state.json text, the state parsed and the
/// parameter names, checked for shape.
struct opened_snapshot {
  std::vector<at::Tensor> t;
  std::string text;
  json state;
  std::vector<std::string> names;
};

opened_snapshot open_snapshot(transport::handle snap) {
  const auto where = "snapshot " + std::to_string(snap);
  opened_snapshot o;
  o.t = transport::acquire(snap, at::Device(at::kCPU));
  if (o.t.size() < 2 || o.t[0].scalar_type() != at::kByte || o.t[0].dim() != 1)
    throw error(errc::bad_input, where + " is not a drafter snapshot");
  const auto bytes = o.t[0].contiguous();
  o.text.assign(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()), static_cast<size_t>(bytes.numel()));
  try {
    o.state = json::parse(o.text);
    o.names = o.state.at("parameters").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw error(errc::bad_input, where + ": malformed state: " + e.what());
  }
  if (o.t.size() != 2 + 3 * o.names.size())
    throw error(errc::bad_input, where + " has " + std::to_string(o.t.size()) + " tensors, expected "
                                   + std::to_string(2 + 3 * o.names.size()));
  return o;
}

} // namespace

snapshot_weights read_snapshot_weights(transport::handle snap) {
  auto o = open_snapshot(snap);
  snapshot_weights w;
  w.step = o.state.value("step", int64_t{0});
  w.state = std::move(o.state);
  w.names = std::move(o.names);
  w.weights.assign(o.t.begin() + 2, o.t.begin() + 2 + static_cast<std::ptrdiff_t>(w.names.size()));
  return w;
}

void write_checkpoint(transport::handle snap, const fs::path& dir_in, const std::string& extra_json, bool durable) {
  const auto dir = without_trailing_slash(dir_in);
  auto [t, text, state, names] = open_snapshot(snap);
  const auto p = names.size();
  if (!extra_json.empty() && !json::accept(extra_json))
    fail(dir, "extra state is not JSON: " + extra_json.substr(0, 80));
  state["extra"] = extra_json;
  // The runtime's cursor and ledger are bytes a resume trusts, as much as
  // the tensors: checked the same way.
  state["extra_crc32c"] = crc32c_hex(crc32c(extra_json.data(), extra_json.size()));

  std::map<std::string, at::Tensor> weights, optim;
  for (size_t i = 0; i < p; ++i) {
    weights[names[i]] = t[2 + i];
    optim["exp_avg." + names[i]] = t[2 + p + i];
    optim["exp_avg_sq." + names[i]] = t[2 + 2 * p + i];
  }
  optim["step"] = t[1].reshape({});

  // A CRC-32C of every tensor's bytes, so that a resume can tell a complete
  // checkpoint from one whose bytes changed (verify_checkpoint).
  // Bytes on disk: data, headers, state.json, a page per file and `latest`.
  uint64_t bytes_needed = 2 * text.size() + 4 * 4096;
  auto& sums = state["checksums"];
  for (const auto& [file, tensors] : {std::pair{"weights.safetensors", &weights},
                                      std::pair{"optimizer.safetensors", &optim}}) {
    auto& f = sums[file];
    f = json::object();
    const auto crcs = tensor_crcs(*tensors);
    size_t i = 0;
    for (const auto& [name, x] : *tensors) {
      f[name] = crcs[i++];
      bytes_needed += static_cast<uint64_t>(x.numel()) * x.element_size() + name.size() + 96;  // data + its header entry
    }
  }

  const fs::path tmp = dir.string() + ".tmp";
  const auto parent = dir.parent_path().empty() ? fs::path(".") : dir.parent_path();
  // Disk space: the new checkpoint is written next to the previous ones
  // before any of them goes; fail before writing rather than half-way.
  auto out_of_space = [&](const std::string& how) {
    remove_tree(tmp);  // give back what the attempt took; the previous checkpoints stay
    const auto avail = available_bytes(parent);
    fail(dir, how + ": the checkpoint needs " + std::to_string(bytes_needed) + " bytes ("
                + human_bytes(bytes_needed) + "), " + std::to_string(avail) + " bytes (" + human_bytes(avail)
                + ") are free on the file system of " + parent.string()
                + "; the previous checkpoints are intact (free space or set checkpoint.dir to a larger disk, "
                  "then tandem run --resume)");
  };
  try {
    remove_tree(tmp);  // a crashed earlier attempt
    fs::create_directories(parent);
    // (TANDEM_CHECKPOINT_SKIP_SPACE_CHECK=1: the tests' way to reach a real
    // ENOSPC half-way through a write.)
    const char* skip = std::getenv("TANDEM_CHECKPOINT_SKIP_SPACE_CHECK");
    if ((skip == nullptr || std::string(skip) != "1") && available_bytes(parent) < bytes_needed)
      out_of_space("not enough disk space");
    fs::create_directory(tmp);
    try {
      save_safetensors(tmp / "weights.safetensors", weights, {{"format", "pt"}}, durable);
      crash_point("weights", dir);
      save_safetensors(tmp / "optimizer.safetensors", optim, {{"format", "tandem"}}, durable);
      crash_point("optimizer", dir);
      write_synced(tmp / "state.json", state.dump(2) + "\n", "state", dir, durable);
      if (durable)
        fsync_dir(tmp);
    } catch (const error& e) {
      if (std::string(e.what()).find(std::strerror(ENOSPC)) != std::string::npos
          || std::string(e.what()).find(std::strerror(EDQUOT)) != std::string::npos)
        out_of_space(std::string("disk full (") + e.what() + ")");
      remove_tree(tmp);
      throw;
    }
    crash_point("before_swap", dir);
    swap_into_place(tmp, dir);
    if (durable)
      fsync_dir(parent);
    crash_point("after_swap", dir);
    write_latest(parent, dir.filename().string(), durable);
    crash_point("after_latest", dir);
  } catch (const fs::filesystem_error& e) {
    remove_tree(tmp);
    if (e.code() == std::errc::no_space_on_device)
      out_of_space(std::string("disk full (") + e.what() + ")");
    fail(dir, std::string("cannot write checkpoint: ") + e.what());
  }
}

bool is_checkpoint_entry(const std::string& name) {
  return name == "latest" || name == "latest.tmp" || name.rfind("step-", 0) == 0;
}

void remove_checkpoints(const fs::path& root) {
  std::error_code ec;
  if (!fs::is_directory(fs::symlink_status(root, ec)))
    return;  // missing, a file, or a link: not ours to empty
  std::vector<fs::path> ours;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (is_checkpoint_entry(e.path().filename().string()))
      ours.push_back(e.path());
  for (const auto& p : ours)
    remove_tree(p);
  ::rmdir(root.c_str());  // only if that left it empty
}

std::string checkpoint_name(int64_t step) {
  char name[32];
  std::snprintf(name, sizeof name, "step-%08lld", static_cast<long long>(step));
  return name;
}

void write_latest(const fs::path& root, const std::string& name, bool durable) {
  const auto tmp = root / "latest.tmp";
  write_synced(tmp, name + "\n", nullptr, {}, durable);
  if (::rename(tmp.c_str(), (root / "latest").c_str()) != 0)
    fail(root / "latest", "cannot rename " + tmp.string() + " over it: " + errno_text());
  if (durable)
    fsync_dir(root);
}

std::string read_latest(const fs::path& root) {
  std::ifstream in(root / "latest");
  std::string name;
  if (in)
    std::getline(in, name);
  return name;
}

std::vector<fs::path> list_checkpoints(const fs::path& root) {
  std::vector<std::pair<int64_t, fs::path>> found;
  std::error_code ec;
  if (!fs::is_directory(root, ec))
    return {};
  for (const auto& e : fs::directory_iterator(root, ec)) {
    const auto k = step_of(e.path());
    if (k >= 0 && e.is_directory(ec) && fs::is_regular_file(e.path() / "state.json", ec))
      found.emplace_back(k, e.path());
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first > b.first; });
  std::vector<fs::path> out;
  for (auto& f : found)
    out.push_back(std::move(f.second));
  return out;
}

void verify_checkpoint(const fs::path& dir) {
  (void)read_checkpoint(dir);
}

resume_lookup find_resume_checkpoint(const fs::path& root) {
  return find_resume_checkpoint(std::vector<fs::path>{root});
}

resume_lookup find_resume_checkpoint(const std::vector<fs::path>& roots) {
  resume_lookup r;
  std::vector<fs::path> all;
  for (const auto& root : roots)
    for (auto& dir : list_checkpoints(root))
      all.push_back(std::move(dir));
  // Newest first; of equal steps, the earlier root's.
  std::stable_sort(all.begin(), all.end(), [](const fs::path& a, const fs::path& b) { return step_of(a) > step_of(b); });
  for (const auto& dir : all) {
    const auto root = dir.parent_path();
    try {
      verify_checkpoint(dir);
    } catch (const std::exception& e) {
      // Kept for a person to look at, out of every later lookup's way.
      fs::path aside = dir.string() + ".corrupt";
      std::error_code ec;
      remove_tree(aside);
      fs::rename(dir, aside, ec);
      r.warnings.push_back(std::string(e.what()) + " — skipped"
                           + (ec ? std::string(" (could not move it aside: ") + ec.message() + ")"
                                 : ", moved aside to " + aside.filename().string())
                           + "; trying the previous checkpoint");
      continue;
    }
    r.dir = dir;
    r.step = step_of(dir);
    const auto latest = read_latest(root);
    if (!latest.empty() && latest != dir.filename().string())
      r.warnings.push_back(root.string() + "/latest names '" + latest + "', but the newest complete checkpoint is "
                           + dir.filename().string() + ": resuming from it");
    return r;
  }
  return r;
}

std::vector<fs::path> rotate_checkpoints(const fs::path& root, int keep, const fs::path& protect) {
  return rotate_checkpoints(root, keep, std::vector<fs::path>{protect});
}

std::vector<fs::path> rotate_checkpoints(const fs::path& root, int keep, const std::vector<fs::path>& protect) {
  std::vector<fs::path> removed;
  if (keep <= 0)
    return removed;
  const auto all = list_checkpoints(root);
  std::error_code ec;
  std::vector<fs::path> keep_too;
  for (const auto& p : protect)
    if (!p.empty())
      keep_too.push_back(fs::weakly_canonical(p, ec));
  for (size_t i = static_cast<size_t>(keep); i < all.size(); ++i) {
    if (std::find(keep_too.begin(), keep_too.end(), fs::weakly_canonical(all[i], ec)) != keep_too.end())
      continue;
    remove_tree(all[i]);
    if (!fs::exists(all[i], ec))
      removed.push_back(all[i]);
  }
  // The writer is the only one here: a .tmp folder now is a killed write's.
  for (auto& p : remove_killed_writes(root))
    removed.push_back(std::move(p));
  return removed;
}

std::vector<fs::path> remove_killed_writes(const fs::path& root) {
  std::vector<fs::path> stale;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(root, ec))
    if (e.path().filename().string().rfind("step-", 0) == 0 && e.path().extension() == ".tmp")
      stale.push_back(e.path());
  for (const auto& p : stale)
    remove_tree(p);
  return stale;
}

uint64_t checkpoint_bytes(int64_t parameters) {
  // fp32 weights + two fp32 moments, plus headers and state.json.
  return static_cast<uint64_t>(parameters) * 12 + (uint64_t{1} << 16);
}

uint64_t available_bytes(const fs::path& p) {
  fs::path at = p;
  std::error_code ec;
  while (!at.empty() && !fs::exists(at, ec))
    at = at.parent_path();
  struct statvfs v {};
  if (::statvfs(at.empty() ? "." : at.c_str(), &v) != 0)
    return UINT64_MAX;  // unknown: do not refuse
  return static_cast<uint64_t>(v.f_bavail) * v.f_frsize;
}

uint64_t folder_bytes(const fs::path& dir) {
  uint64_t n = 0;
  std::error_code ec;
  for (auto it = fs::recursive_directory_iterator(dir, ec); !ec && it != fs::recursive_directory_iterator();
       it.increment(ec))
    if (it->is_regular_file(ec))
      n += it->file_size(ec);
  return n;
}

std::string human_bytes(uint64_t n) {
  const char* unit[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char s[32];
  std::snprintf(s, sizeof s, u == 0 ? "%.0f %s" : "%.1f %s", v, unit[u]);
  return s;
}

checkpoint_contents read_checkpoint(const fs::path& dir_in) {
  const auto dir = without_trailing_slash(dir_in);
  const auto file = dir / "state.json";
  checkpoint_contents c;
  c.state = read_state(dir);
  const auto& s = c.state;
  const auto& format = field(s, "format", &json::is_string, "a string", file);
  if (format.get<std::string>() != checkpoint_format)
    fail(file, "field 'format' is " + format.dump() + ", expected \"" + checkpoint_format + "\"");
  const auto& version = field(s, "version", &json::is_number_integer, "an integer", file);
  if (version.get<int64_t>() != checkpoint_version)
    fail(file, "field 'version' is " + version.dump() + ", this Tandem reads version "
                 + std::to_string(checkpoint_version));
  const auto& step = field(s, "step", &json::is_number_integer, "an integer", file);
  c.step = step.get<int64_t>();
  if (c.step < 0)
    fail(file, "field 'step' is negative");
  const auto& gen = field(s, "generator", &json::is_object, "an object", file);
  field(gen, "device", &json::is_string, "a string", file, "generator");
  field(gen, "state", &json::is_string, "a string", file, "generator");
  field(s, "drafter", &json::is_object, "an object", file);
  const auto& params = field(s, "parameters", &json::is_array, "an array", file);
  if (params.empty())
    fail(file, "field 'parameters' is empty");
  for (const auto& n : params) {
    if (!n.is_string())
      fail(file, "field 'parameters' must hold strings, holds " + n.dump());
    c.names.push_back(n.get<std::string>());
  }
  if (s.contains("extra") && !s.at("extra").is_string())
    fail(file, "field 'extra' must be a string");
  if (s.contains("extra")) {
    const auto& extra = s.at("extra").get_ref<const std::string&>();
    if (s.contains("extra_crc32c")) {  // checkpoints since it was added
      const auto got = crc32c_hex(crc32c(extra.data(), extra.size()));
      if (!s.at("extra_crc32c").is_string() || s.at("extra_crc32c").get<std::string>() != got)
        fail(file, "field 'extra' is corrupt: its bytes have CRC-32C " + got + ", field 'extra_crc32c' is "
                     + s.at("extra_crc32c").dump());
    }
    if (!extra.empty()) {
      const auto e = json::parse(extra, nullptr, false);
      if (e.is_discarded())
        fail(file, "field 'extra' is not JSON: " + extra.substr(0, 80));
      if (e.is_object() && e.contains("step")
          && (!e.at("step").is_number_integer() || e.at("step").get<int64_t>() != c.step))
        fail(file, "field 'extra' says step " + e.at("step").dump() + ", field 'step' is "
                     + std::to_string(c.step));
    }
  }

  const auto wfile = dir / "weights.safetensors";
  const auto ofile = dir / "optimizer.safetensors";
  std::error_code ec;
  for (const auto& f : {wfile, ofile})
    if (!fs::is_regular_file(f, ec))
      fail(f, "missing");
  auto weights = load_safetensors(wfile);  // throws naming the file
  auto optim = load_safetensors(ofile);
  for (const auto& name : c.names) {
    auto w = need_f32(weights, name, wfile);
    auto m = need_f32(optim, "exp_avg." + name, ofile);
    auto v = need_f32(optim, "exp_avg_sq." + name, ofile);
    if (m.sizes() != w.sizes() || v.sizes() != w.sizes())
      fail(ofile, "moments of '" + name + "' do not have the shape of the weight in "
                    + wfile.filename().string());
    c.weights.push_back(w);
    c.exp_avg.push_back(m);
    c.exp_avg_sq.push_back(v);
  }
  // Checkpoints since the checksums were added: every tensor's bytes as
  // written (older ones have none and are taken as they are).
  if (s.contains("checksums")) {
    const auto& sums = field(s, "checksums", &json::is_object, "an object", file);
    for (const auto& [fname, tensors, path] : {std::tuple{"weights.safetensors", &weights, wfile},
                                               std::tuple{"optimizer.safetensors", &optim, ofile}}) {
      const auto& f = field(sums, fname, &json::is_object, "an object", file, "checksums");
      const auto crcs = tensor_crcs(*tensors);
      size_t i = 0;
      for (const auto& [name, x] : *tensors) {
        if (!f.contains(name) || !f.at(name).is_string())
          fail(path, "tensor '" + name + "' has no checksum in " + file.string());
        const auto& got = crcs[i++];
        if (got != f.at(name).get<std::string>())
          fail(path, "tensor '" + name + "' is corrupt: its bytes have CRC-32C " + got + ", "
                       + file.filename().string() + " recorded " + f.at(name).get<std::string>());
      }
      if (f.size() != tensors->size())
        fail(path, "holds " + std::to_string(tensors->size()) + " tensors, " + file.filename().string()
                     + " recorded checksums of " + std::to_string(f.size()));
    }
  }
  auto st = need_f32(optim, "step", ofile);
  if (st.numel() != 1)
    fail(ofile, "tensor 'step' must hold one value");
  const double stored = st.item<double>();
  if (stored != static_cast<double>(c.step))
    fail(ofile, "tensor 'step' is " + json(stored).dump() + ", " + file.string() + " says "
                  + std::to_string(c.step));
  return c;
}

std::string read_checkpoint_extra(const fs::path& dir_in) {
  const auto dir = without_trailing_slash(dir_in);
  const auto s = read_state(dir);
  const auto& e = field(s, "extra", &json::is_string, "a string", dir / "state.json");
  return e.get<std::string>();
}

} // namespace tandem::gpu
