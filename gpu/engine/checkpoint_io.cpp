#include "gpu/engine/checkpoint_io.hpp"
#include "gpu/engine/checkpoint.hpp"

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <sstream>

#include <fcntl.h>
#include <unistd.h>

#include "gpu/engine/drafter_engine.hpp"
#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"
#include "gpu/transport/tensors.hpp"

namespace tandem::gpu {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

[[noreturn]] void fail(const fs::path& p, const std::string& what) {
  throw error(errc::bad_input, p.string() + ": " + what);
}

std::string errno_text() {
  return std::strerror(errno);
}

/// Writes `text` to `p` and fsyncs it.
void write_synced(const fs::path& p, const std::string& text) {
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
  if (::fsync(fd) != 0) {
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
    fs::remove_all(tmp, ec);
    return;
  }
  if (errno != EINVAL && errno != ENOSYS && errno != ENOTSUP && errno != EOPNOTSUPP)
    fail(dir, "cannot exchange with " + tmp.string() + ": " + errno_text());
  // A file system without RENAME_EXCHANGE: move the old one aside first (a
  // crash between the two renames leaves both complete, as `dir`.old and
  // `dir`.tmp).
  const fs::path old = dir.string() + ".old";
  fs::remove_all(old, ec);
  if (::rename(dir.c_str(), old.c_str()) != 0)
    fail(dir, "cannot move aside to " + old.string() + ": " + errno_text());
  if (::rename(tmp.c_str(), dir.c_str()) != 0)
    fail(dir, "cannot rename " + tmp.string() + " to it: " + errno_text());
  fs::remove_all(old, ec);
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

void write_checkpoint(transport::handle snap, const fs::path& dir_in, const std::string& extra_json) {
  const auto dir = without_trailing_slash(dir_in);
  const auto where = "snapshot " + std::to_string(snap);
  auto t = transport::acquire(snap, at::Device(at::kCPU));
  if (t.size() < 2 || t[0].scalar_type() != at::kByte || t[0].dim() != 1)
    throw error(errc::bad_input, where + " is not a drafter snapshot");
  const auto bytes = t[0].contiguous();
  std::string text(reinterpret_cast<const char*>(bytes.data_ptr<uint8_t>()),
                   static_cast<size_t>(bytes.numel()));
  json state;
  std::vector<std::string> names;
  try {
    state = json::parse(text);
    names = state.at("parameters").get<std::vector<std::string>>();
  } catch (const json::exception& e) {
    throw error(errc::bad_input, where + ": malformed state: " + e.what());
  }
  const auto p = names.size();
  if (t.size() != 2 + 3 * p)
    throw error(errc::bad_input, where + " has " + std::to_string(t.size()) + " tensors, expected "
                                   + std::to_string(2 + 3 * p));
  if (!extra_json.empty() && !json::accept(extra_json))
    fail(dir, "extra state is not JSON: " + extra_json.substr(0, 80));
  state["extra"] = extra_json;

  std::map<std::string, at::Tensor> weights, optim;
  for (size_t i = 0; i < p; ++i) {
    weights[names[i]] = t[2 + i];
    optim["exp_avg." + names[i]] = t[2 + p + i];
    optim["exp_avg_sq." + names[i]] = t[2 + 2 * p + i];
  }
  optim["step"] = t[1].reshape({});

  const fs::path tmp = dir.string() + ".tmp";
  try {
    std::error_code ec;
    fs::remove_all(tmp, ec);  // a crashed earlier attempt
    if (!dir.parent_path().empty())
      fs::create_directories(dir.parent_path());
    fs::create_directory(tmp);
    save_safetensors(tmp / "weights.safetensors", weights, {{"format", "pt"}});
    save_safetensors(tmp / "optimizer.safetensors", optim, {{"format", "tandem"}});
    write_synced(tmp / "state.json", state.dump(2) + "\n");
    fsync_dir(tmp);
    swap_into_place(tmp, dir);
    fsync_dir(dir.parent_path().empty() ? fs::path(".") : dir.parent_path());
  } catch (const fs::filesystem_error& e) {
    fail(dir, std::string("cannot write checkpoint: ") + e.what());
  }
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
