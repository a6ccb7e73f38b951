#include "gpu/pch.hpp"

#include "gpu/io/safetensors.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>
#include <memory>
#include <set>
#include <sstream>
#include <vector>

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <nlohmann/json.hpp>

#include "gpu/device/error.hpp"
#include "gpu/device/shape_text.hpp"
#include "gpu/io/parallel.hpp"

#if !defined(__BYTE_ORDER__) || __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "safetensors data is little-endian; Tandem reads it in place on little-endian hosts only"
#endif

namespace tandem::gpu {

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

/// The Python library caps the header at 100 MB; so do we.
constexpr uint64_t max_header_bytes = 100'000'000;

/// One dtype of the format. `order` is the Python library's sort key
/// (higher first), which puts wider types first and keeps every tensor
/// aligned to its element size.
struct dtype_info {
  const char* name;
  at::ScalarType type;
  size_t size;
  int order;
};

constexpr dtype_info dtype_table[] = {
  {"U64", at::kUInt64, 8, 14},   {"I64", at::kLong, 8, 13},
  {"F64", at::kDouble, 8, 12},   {"F32", at::kFloat, 4, 11},
  {"U32", at::kUInt32, 4, 10},   {"I32", at::kInt, 4, 9},
  {"BF16", at::kBFloat16, 2, 8}, {"F16", at::kHalf, 2, 7},
  {"U16", at::kUInt16, 2, 6},    {"I16", at::kShort, 2, 5},
  {"F8_E4M3", at::kFloat8_e4m3fn, 1, 4}, {"F8_E5M2", at::kFloat8_e5m2, 1, 3},
  {"I8", at::kChar, 1, 2},       {"U8", at::kByte, 1, 1},
  {"BOOL", at::kBool, 1, 0},
};

const dtype_info* find_dtype(const std::string& name) {
  for (const auto& d : dtype_table)
    if (name == d.name)
      return &d;
  return nullptr;
}

const dtype_info* find_dtype(at::ScalarType type) {
  for (const auto& d : dtype_table)
    if (type == d.type)
      return &d;
  return nullptr;
}

std::string dtype_text(at::ScalarType type) {
  if (auto* d = find_dtype(type))
    return d->name;
  return c10::toString(type);
}

[[noreturn]] void fail(const fs::path& file, const std::string& what) {
  throw error(errc::bad_input, file.string() + ": " + what);
}

std::string errno_text() {
  return std::strerror(errno);
}

/// A read-only mapping of a whole file; unmapped when the last tensor over
/// it (each holds a shared_ptr in its deleter) is gone.
class file_mapping {
public:
  explicit file_mapping(const fs::path& file) {
    int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) {
      if (errno == ENOENT)
        fail(file, "no such file");
      fail(file, "cannot open: " + errno_text());
    }
    struct stat st {};
    if (::fstat(fd, &st) != 0) {
      auto why = errno_text();
      ::close(fd);
      fail(file, "cannot stat: " + why);
    }
    if (!S_ISREG(st.st_mode)) {
      ::close(fd);
      fail(file, "not a regular file");
    }
    size_ = static_cast<size_t>(st.st_size);
    if (size_ > 0) {
      void* p = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
      if (p == MAP_FAILED) {
        auto why = errno_text();
        ::close(fd);
        fail(file, "cannot mmap: " + why);
      }
      base_ = static_cast<const uint8_t*>(p);
    }
    ::close(fd);
  }

  ~file_mapping() {
    if (base_ != nullptr)
      ::munmap(const_cast<uint8_t*>(base_), size_);
  }

  file_mapping(const file_mapping&) = delete;
  file_mapping& operator=(const file_mapping&) = delete;

  const uint8_t* data() const { return base_; }
  size_t size() const { return size_; }

private:
  const uint8_t* base_ = nullptr;
  size_t size_ = 0;
};

/// A header entry, checked against the header alone.
struct entry {
  std::string name;
  const dtype_info* dtype;
  std::vector<int64_t> shape;
  uint64_t begin;
  uint64_t end;
};

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i)
    v = (v << 8) | p[i];
  return v;
}

std::vector<uint64_t> unsigned_array(const fs::path& file, const std::string& where,
                                     const json& j) {
  if (!j.is_array())
    fail(file, where + " must be an array of non-negative integers, got " + j.dump());
  std::vector<uint64_t> out;
  for (const auto& x : j) {
    if (!x.is_number_unsigned())
      fail(file, where + " must be an array of non-negative integers, got " + j.dump());
    out.push_back(x.get<uint64_t>());
  }
  return out;
}

entry parse_entry(const fs::path& file, const std::string& name, const json& j) {
  const std::string where = "tensor '" + name + "'";
  if (!j.is_object())
    fail(file, where + ": header entry must be an object, got " + j.dump());
  for (const char* field : {"dtype", "shape", "data_offsets"})
    if (!j.contains(field))
      fail(file, where + ": missing field '" + field + "'");
  const auto& jd = j["dtype"];
  if (!jd.is_string())
    fail(file, where + ": field 'dtype' must be a string, got " + jd.dump());
  entry e;
  e.name = name;
  e.dtype = find_dtype(jd.get<std::string>());
  if (e.dtype == nullptr)
    fail(file, where + ": unknown dtype '" + jd.get<std::string>() + "' (Tandem reads "
                   "F64 F32 BF16 F16 F8_E4M3 F8_E5M2 I64 I32 I16 I8 U64 U32 U16 U8 BOOL)");
  auto dims = unsigned_array(file, where + ": field 'shape'", j["shape"]);
  auto offsets = unsigned_array(file, where + ": field 'data_offsets'", j["data_offsets"]);
  if (offsets.size() != 2)
    fail(file, where + ": field 'data_offsets' must hold [begin, end], got "
                   + j["data_offsets"].dump());
  e.begin = offsets[0];
  e.end = offsets[1];
  if (e.end < e.begin)
    fail(file, where + ": data_offsets " + j["data_offsets"].dump() + " end before they begin");
  uint64_t bytes = e.dtype->size;
  for (auto d : dims) {
    if (d > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())
        || __builtin_mul_overflow(bytes, d, &bytes))
      fail(file, where + ": shape " + j["shape"].dump() + " is too large");
    e.shape.push_back(static_cast<int64_t>(d));
  }
  if (bytes != e.end - e.begin)
    fail(file, where + ": shape " + shape_text(e.shape) + " of " + e.dtype->name + " needs "
                   + std::to_string(bytes) + " bytes but data_offsets "
                   + j["data_offsets"].dump() + " span " + std::to_string(e.end - e.begin));
  return e;
}

/// Reads one .safetensors file into `out` (tensors and metadata).
void read_file(const fs::path& file, safetensors_file& out) {
  auto map = std::make_shared<file_mapping>(file);
  const size_t size = map->size();
  if (size < 8)
    fail(file, "truncated: " + std::to_string(size)
                   + " bytes, shorter than the 8-byte header length");
  const uint64_t header_len = read_u64_le(map->data());
  if (header_len > size - 8)
    fail(file, "truncated: header length " + std::to_string(header_len)
                   + " goes past the end of the file (" + std::to_string(size) + " bytes)");
  if (header_len > max_header_bytes)
    fail(file, "header length " + std::to_string(header_len) + " exceeds the "
                   + std::to_string(max_header_bytes) + "-byte limit");
  const auto* header = reinterpret_cast<const char*>(map->data() + 8);
  json h;
  try {
    h = json::parse(header, header + header_len);
  } catch (const json::exception& ex) {
    fail(file, std::string("header is not valid JSON: ") + ex.what());
  }
  if (!h.is_object())
    fail(file, "header must be a JSON object, got a " + std::string(h.type_name()));

  std::vector<entry> entries;
  for (auto it = h.begin(); it != h.end(); ++it) {
    if (it.key() == "__metadata__") {
      if (!it->is_object())
        fail(file, "field '__metadata__' must be an object of strings, got " + it->dump());
      for (auto m = it->begin(); m != it->end(); ++m) {
        if (!m->is_string())
          fail(file, "field '__metadata__." + m.key() + "' must be a string, got " + m->dump());
        out.metadata[m.key()] = m->get<std::string>();
      }
      continue;
    }
    entries.push_back(parse_entry(file, it.key(), *it));
  }

  // The data section must be tiled exactly: no overlap, no gap, nothing past
  // its end, no unclaimed bytes after the last tensor.
  const uint64_t data_len = size - 8 - header_len;
  std::sort(entries.begin(), entries.end(), [](const entry& a, const entry& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  uint64_t expected = 0;
  const entry* prev = nullptr;
  for (const auto& e : entries) {
    const std::string where = "tensor '" + e.name + "': data_offsets ["
                              + std::to_string(e.begin) + ", " + std::to_string(e.end) + "]";
    if (e.end > data_len)
      fail(file, where + " go past the end of the data (" + std::to_string(data_len)
                     + " bytes; is the file truncated?)");
    if (e.begin < expected)
      fail(file, where + " overlap tensor '" + prev->name + "' (which ends at "
                     + std::to_string(expected) + ")");
    if (e.begin > expected)
      fail(file, where + " leave a gap of " + std::to_string(e.begin - expected)
                     + " bytes after " + (prev ? "tensor '" + prev->name + "'" : "the header"));
    expected = e.end;
    prev = &e;
  }
  if (expected != data_len)
    fail(file, std::to_string(data_len - expected) + " bytes after the last tensor"
                   + (prev ? " ('" + prev->name + "')" : "") + " belong to no tensor");

  const uint8_t* data = map->data() + 8 + header_len;
  for (const auto& e : entries) {
    auto options = at::TensorOptions().dtype(e.dtype->type).device(at::kCPU);
    // from_blob takes a mutable pointer; the mapping is read-only (documented).
    void* ptr = const_cast<uint8_t*>(data + e.begin);
    at::Tensor t;
    if (reinterpret_cast<uintptr_t>(ptr) % e.dtype->size == 0) {
      t = at::from_blob(ptr, e.shape, [map](void*) {}, options);
    } else {
      t = at::from_blob(ptr, e.shape, options).clone();
    }
    if (!out.tensors.emplace(e.name, std::move(t)).second)
      fail(file, "tensor '" + e.name + "' appears twice");
  }
}

std::string json_value_text(const json& j) {
  return j.is_string() ? j.get<std::string>() : j.dump();
}

/// Reads a sharded checkpoint through its index.
safetensors_file read_sharded(const fs::path& index_file) {
  std::string text;
  {
    std::error_code ec;
    if (!fs::exists(index_file, ec))
      fail(index_file, "no such file");
    FILE* f = std::fopen(index_file.c_str(), "rb");
    if (f == nullptr)
      fail(index_file, "cannot open: " + errno_text());
    char buf[65536];
    size_t n = 0;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0)
      text.append(buf, n);
    const bool bad = std::ferror(f) != 0;
    std::fclose(f);
    if (bad)
      fail(index_file, "cannot read");
  }
  json idx;
  try {
    idx = json::parse(text);
  } catch (const json::exception& ex) {
    fail(index_file, std::string("not valid JSON: ") + ex.what());
  }
  if (!idx.is_object())
    fail(index_file, "must be a JSON object");
  if (!idx.contains("weight_map") || !idx["weight_map"].is_object())
    fail(index_file, "missing field 'weight_map' (an object of tensor name -> shard file)");

  // shard file -> tensor names it must hold
  std::map<std::string, std::vector<std::string>> by_shard;
  for (auto it = idx["weight_map"].begin(); it != idx["weight_map"].end(); ++it) {
    if (!it->is_string())
      fail(index_file, "field 'weight_map." + it.key() + "' must be a file name, got "
                           + it->dump());
    by_shard[it->get<std::string>()].push_back(it.key());
  }

  safetensors_file out;
  const auto dir = index_file.parent_path();
  for (const auto& [shard_name, names] : by_shard) {
    const auto shard = dir / shard_name;
    std::error_code ec;
    if (!fs::is_regular_file(shard, ec))
      fail(index_file, "tensor '" + names.front() + "' is in shard '" + shard_name
                           + "', which does not exist (" + shard.string() + ")");
    safetensors_file part;
    read_file(shard, part);
    for (const auto& name : names) {
      auto t = part.tensors.find(name);
      if (t == part.tensors.end())
        fail(index_file, "tensor '" + name + "' is absent from its shard " + shard.string());
      out.tensors.emplace(name, t->second);
    }
    for (auto& [k, v] : part.metadata)
      out.metadata.emplace(k, v);
  }
  if (idx.contains("metadata")) {
    const auto& m = idx["metadata"];
    if (!m.is_object() && !m.is_null())
      fail(index_file, "field 'metadata' must be an object, got " + m.dump());
    if (m.is_object())
      for (auto it = m.begin(); it != m.end(); ++it)
        out.metadata[it.key()] = json_value_text(*it);
  }
  return out;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

/// Writes all of [p, p + n), retrying short writes.
void write_all(int fd, const void* p, size_t n, const fs::path& file) {
  const auto* c = static_cast<const uint8_t*>(p);
  while (n > 0) {
    const size_t chunk = std::min<size_t>(n, size_t{1} << 30);
    ssize_t w = ::write(fd, c, chunk);
    if (w < 0) {
      if (errno == EINTR)
        continue;
      fail(file, "cannot write: " + errno_text());
    }
    c += w;
    n -= static_cast<size_t>(w);
  }
}

} // namespace

std::optional<std::string> safetensors_dtype_name(at::ScalarType dtype) {
  if (auto* d = find_dtype(dtype))
    return std::string(d->name);
  return std::nullopt;
}

safetensors_file read_safetensors(const fs::path& p) {
  std::error_code ec;
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "model.safetensors", ec)) {
      safetensors_file out;
      read_file(p / "model.safetensors", out);
      return out;
    }
    if (fs::exists(p / "model.safetensors.index.json", ec))
      return read_sharded(p / "model.safetensors.index.json");
    fail(p, "directory holds neither model.safetensors nor model.safetensors.index.json");
  }
  if (ends_with(p.filename().string(), ".index.json"))
    return read_sharded(p);
  safetensors_file out;
  read_file(p, out);
  return out;
}

std::map<std::string, at::Tensor> load_safetensors(const fs::path& p) {
  return read_safetensors(p).tensors;
}

namespace {

struct save_item {
  const std::string* name;
  const at::Tensor* tensor;
  const dtype_info* dtype;
  uint64_t bytes;
};

/// The data of a large file of host tensors, copied by several threads into
/// a shared mapping of the file: its blocks reserved first (fallocate: a
/// full disk is ENOSPC here, never a SIGBUS later), then 64 MiB pieces
/// copied in parallel.  A single write() is bound by one core (on a tmpfs,
/// by the first-touch page faults of the new pages).  False (nothing
/// written) when it does not apply: small files, device tensors, a file
/// system without fallocate; the caller then writes sequentially.
bool write_in_parallel(int fd, uint64_t data_start, uint64_t data_bytes, const std::vector<save_item>& items,
                       const fs::path& file) {
  constexpr uint64_t piece = uint64_t{64} << 20;
  if (data_bytes < 4 * piece)
    return false;
  for (const auto& it : items)
    if (!it.tensor->device().is_cpu() || !it.tensor->is_contiguous())
      return false;
  const uint64_t total = data_start + data_bytes;
  if (::fallocate(fd, 0, 0, static_cast<off_t>(total)) != 0) {
    if (errno == EOPNOTSUPP || errno == ENOSYS)
      return false;
    fail(file, "cannot write: " + errno_text());
  }
  void* map = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (map == MAP_FAILED)
    return false;
  struct job {
    const uint8_t* from;
    uint64_t to, bytes;
  };
  std::vector<job> jobs;
  uint64_t at = data_start;
  for (const auto& it : items) {
    const auto* from = static_cast<const uint8_t*>(it.tensor->data_ptr());
    for (uint64_t done = 0; done < it.bytes; done += piece)
      jobs.push_back({from + done, at + done, std::min(piece, it.bytes - done)});
    at += it.bytes;
  }
  io::parallel_for(jobs.size(), io::copy_threads(), [&](size_t i) {
    std::memcpy(static_cast<uint8_t*>(map) + jobs[i].to, jobs[i].from, jobs[i].bytes);
  });
  const int synced = ::msync(map, total, MS_SYNC);
  const int err = errno;
  ::munmap(map, total);
  if (synced != 0) {
    errno = err;
    fail(file, "cannot write: " + errno_text());
  }
  return true;
}

} // namespace

void save_safetensors(const fs::path& p, const std::map<std::string, at::Tensor>& tensors,
                      const std::map<std::string, std::string>& metadata, bool durable) {
  using item = save_item;
  std::vector<item> items;
  for (const auto& [name, t] : tensors) {
    if (name.empty() || name == "__metadata__")
      fail(p, "tensor name '" + name + "' is reserved");
    if (!t.defined())
      fail(p, "tensor '" + name + "' is undefined");
    if (t.layout() != at::kStrided)
      fail(p, "tensor '" + name + "' has a non-strided layout (sparse?); densify it first");
    auto* d = find_dtype(t.scalar_type());
    if (d == nullptr)
      fail(p, "tensor '" + name + "' has dtype " + c10::toString(t.scalar_type())
                  + ", which safetensors (as Tandem writes it) cannot hold");
    items.push_back({&name, &t, d, static_cast<uint64_t>(t.numel()) * d->size});
  }
  std::stable_sort(items.begin(), items.end(), [](const item& a, const item& b) {
    return a.dtype->order != b.dtype->order ? a.dtype->order > b.dtype->order
                                            : *a.name < *b.name;
  });

  nlohmann::ordered_json h = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    auto& m = h["__metadata__"];
    m = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata)
      m[k] = v;
  }
  uint64_t offset = 0;
  for (const auto& it : items) {
    auto& e = h[*it.name];
    e["dtype"] = it.dtype->name;
    e["shape"] = it.tensor->sizes().vec();
    e["data_offsets"] = {offset, offset + it.bytes};
    offset += it.bytes;
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const nlohmann::json::exception& ex) {
    fail(p, std::string("cannot encode the header (names and metadata must be UTF-8): ")
                + ex.what());
  }
  header.append((8 - header.size() % 8) % 8, ' ');

  fs::path tmp = p;
  tmp += ".tmp";
  int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0)
    fail(tmp, "cannot create: " + errno_text());
  try {
    uint8_t len[8];
    for (int i = 0; i < 8; ++i)
      len[i] = static_cast<uint8_t>(static_cast<uint64_t>(header.size()) >> (8 * i));
    write_all(fd, len, sizeof len, tmp);
    write_all(fd, header.data(), header.size(), tmp);
    const uint64_t data_start = sizeof len + header.size();
    if (!write_in_parallel(fd, data_start, offset, items, tmp)) {
      for (const auto& it : items) {
        // One tensor at a time, so a checkpoint on the GPU is never all on the host.
        auto cpu = it.tensor->detach().to(at::kCPU).contiguous();
        write_all(fd, cpu.data_ptr(), it.bytes, tmp);
      }
    }
    if (durable && ::fsync(fd) != 0)
      fail(tmp, "cannot fsync: " + errno_text());
    if (::close(fd) != 0) {
      fd = -1;
      fail(tmp, "cannot close: " + errno_text());
    }
    fd = -1;
    if (::rename(tmp.c_str(), p.c_str()) != 0)
      fail(p, "cannot rename " + tmp.string() + " over it: " + errno_text());
  } catch (...) {
    if (fd >= 0)
      ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (!durable)
    return;
  // Make the rename itself durable.
  auto dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
  int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

at::Tensor require_tensor(const std::map<std::string, at::Tensor>& tensors,
                          const std::string& name, at::IntArrayRef shape, at::ScalarType dtype,
                          const std::string& file_for_messages) {
  auto it = tensors.find(name);
  if (it == tensors.end())
    throw error(errc::bad_input, "missing tensor " + name + " in " + file_for_messages);
  const auto& t = it->second;
  if (t.sizes() != shape)
    throw error(errc::bad_input, file_for_messages + ": tensor '" + name + "' has shape "
                                     + shape_text(t.sizes()) + ", expected "
                                     + shape_text(shape));
  if (t.scalar_type() != dtype)
    throw error(errc::bad_input, file_for_messages + ": tensor '" + name + "' has dtype "
                                     + dtype_text(t.scalar_type()) + ", expected "
                                     + dtype_text(dtype));
  return t;
}

} // namespace tandem::gpu
