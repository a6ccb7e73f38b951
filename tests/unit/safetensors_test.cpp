// gpu/safetensors: round trips, zero-copy mapping, sharded checkpoints, every
// malformed-input error, and cross-checks with the Python `safetensors`
// library run by TANDEM_PYTHON.
#include "gpu/pch.hpp"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <ftw.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "gpu/device/error.hpp"
#include "gpu/io/safetensors.hpp"
#include "gpu/models/qwen3.hpp"
#include "tests/unit/expect_error.hpp"
#include "tests/unit/files.hpp"

namespace fs = std::filesystem;
using namespace tandem;
using namespace tandem::gpu;

using tandem::test::remove_tree;
using tandem::test::read_bytes;
using tandem::test::write_bytes;
using tandem::test::run_python;

namespace {

/// Every dtype Tandem reads and writes, by its safetensors name.
const std::vector<std::pair<std::string, at::ScalarType>> all_dtypes = {
  {"F64", at::kDouble},         {"F32", at::kFloat},         {"BF16", at::kBFloat16},
  {"F16", at::kHalf},           {"F8_E4M3", at::kFloat8_e4m3fn},
  {"F8_E5M2", at::kFloat8_e5m2}, {"I64", at::kLong},          {"I32", at::kInt},
  {"I16", at::kShort},          {"I8", at::kChar},           {"U64", at::kUInt64},
  {"U32", at::kUInt32},         {"U16", at::kUInt16},        {"U8", at::kByte},
  {"BOOL", at::kBool},
};

/// A [3, 4] tensor of `type` whose values every dtype holds exactly; the
/// Python script below builds the same tensors with the same formula.
at::Tensor sample(at::ScalarType type) {
  auto base = at::arange(-5, 7, at::kLong).reshape({3, 4});
  if (type == at::kBool)
    return base.remainder(3).eq(0);
  if (type == at::kByte || type == at::kUInt16 || type == at::kUInt32 || type == at::kUInt64)
    return (base + 5).to(type);
  return base.to(at::kFloat).to(type);
}

/// Same dtype, shape and bytes (works for dtypes without comparison kernels).
::testing::AssertionResult same_bytes(const at::Tensor& a, const at::Tensor& b) {
  if (a.scalar_type() != b.scalar_type())
    return ::testing::AssertionFailure() << "dtype " << a.scalar_type() << " vs " << b.scalar_type();
  if (a.sizes() != b.sizes())
    return ::testing::AssertionFailure() << "shape " << a.sizes() << " vs " << b.sizes();
  auto x = a.contiguous();
  auto y = b.contiguous();
  if (x.nbytes() > 0 && std::memcmp(x.data_ptr(), y.data_ptr(), x.nbytes()) != 0)
    return ::testing::AssertionFailure() << "bytes differ";
  return ::testing::AssertionSuccess();
}

std::string le64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i)
    s[i] = static_cast<char>(v >> (8 * i));
  return s;
}

/// The JSON header of a safetensors file.
std::string header_of(const fs::path& p) {
  auto bytes = read_bytes(p);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i)
    n = (n << 8) | static_cast<uint8_t>(bytes[i]);
  return bytes.substr(8, n);
}

template <class T>
std::string raw(const std::vector<T>& values) {
  return std::string(reinterpret_cast<const char*>(values.data()), values.size() * sizeof(T));
}

using tandem::test::expect_bad_input;

bool mapped_in_this_process(const fs::path& p) {
  auto maps = read_bytes("/proc/self/maps");
  return maps.find(fs::canonical(p).string()) != std::string::npos;
}

class safetensors_test : public ::testing::Test {
protected:
  void SetUp() override {
    auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    dir_ = fs::temp_directory_path()
           / ("tandem_io_" + std::to_string(::getpid()) + "_" + info->test_suite_name() + "_"
              + info->name());
    remove_tree(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    remove_tree(dir_);
  }

  /// A file of `header` (length as given, no padding) followed by `data`.
  fs::path raw_file(const std::string& name, const std::string& header,
                    const std::string& data = {}) {
    auto p = dir_ / name;
    write_bytes(p, le64(header.size()) + header + data);
    return p;
  }

  fs::path dir_;
};

// ------------------------------------------------------------ round trips --

TEST_F(safetensors_test, round_trips_every_dtype) {
  std::map<std::string, at::Tensor> in;
  for (const auto& [name, type] : all_dtypes)
    in["t_" + name] = sample(type);
  in["scalar"] = at::scalar_tensor(2.5, at::kFloat);
  in["empty"] = at::zeros({0, 3}, at::kBFloat16);
  save_safetensors(dir_ / "all.safetensors", in);
  auto out = load_safetensors(dir_ / "all.safetensors");
  ASSERT_EQ(out.size(), in.size());
  for (const auto& [name, t] : in) {
    ASSERT_TRUE(out.count(name)) << name;
    EXPECT_TRUE(same_bytes(out[name], t)) << name;
    EXPECT_EQ(out[name].device(), at::Device(at::kCPU));
  }
}

TEST_F(safetensors_test, round_trips_random_bf16_bit_exactly) {
  at::manual_seed(11);
  auto w = at::randn({17, 33}).to(at::kBFloat16);
  save_safetensors(dir_ / "w.safetensors", {{"w", w}});
  EXPECT_TRUE(same_bytes(load_safetensors(dir_ / "w.safetensors").at("w"), w));
}

TEST_F(safetensors_test, writes_strided_expanded_and_grad_tensors_as_contiguous) {
  auto base = at::arange(24, at::kFloat).reshape({4, 6});
  std::map<std::string, at::Tensor> in = {
    {"transposed", base.t()},
    {"strided", base.index({at::indexing::Slice(), at::indexing::Slice(0, at::indexing::None, 2)})},
    {"expanded", at::arange(3, at::kFloat).expand({5, 3})},
    {"grad", at::ones({2, 2}, at::TensorOptions().requires_grad(true))},
  };
  ASSERT_FALSE(in["transposed"].is_contiguous());
  ASSERT_FALSE(in["strided"].is_contiguous());
  save_safetensors(dir_ / "s.safetensors", in);
  auto out = load_safetensors(dir_ / "s.safetensors");
  for (const auto& [name, t] : in) {
    EXPECT_TRUE(out.at(name).is_contiguous()) << name;
    EXPECT_TRUE(same_bytes(out.at(name), t.detach().contiguous())) << name;
  }
}

TEST_F(safetensors_test, keeps_metadata_and_writes_none_when_empty) {
  const std::map<std::string, std::string> meta = {
    {"format", "pt"}, {"step", "1200"}, {"note", "quotes \" and unicode \xc3\xa9"}};
  save_safetensors(dir_ / "m.safetensors", {{"x", at::ones({2})}}, meta);
  EXPECT_EQ(read_safetensors(dir_ / "m.safetensors").metadata, meta);

  save_safetensors(dir_ / "n.safetensors", {{"x", at::ones({2})}});
  EXPECT_TRUE(read_safetensors(dir_ / "n.safetensors").metadata.empty());
  EXPECT_EQ(header_of(dir_ / "n.safetensors").find("__metadata__"), std::string::npos);
}

TEST_F(safetensors_test, layout_orders_by_dtype_width_then_name_and_pads_header) {
  std::map<std::string, at::Tensor> in = {
    {"a_flag", at::ones({3}, at::kBool)}, {"b_half", at::ones({3}, at::kHalf)},
    {"c_long", at::ones({1}, at::kLong)}, {"a_float", at::ones({1}, at::kFloat)},
    {"z_long", at::ones({1}, at::kLong)}};
  save_safetensors(dir_ / "o.safetensors", in);
  const auto h = header_of(dir_ / "o.safetensors");
  EXPECT_EQ((8 + h.size()) % 8, 0u);
  EXPECT_EQ(h.back() == ' ' || h.back() == '}', true);
  std::vector<size_t> pos;
  for (const char* name : {"\"c_long\"", "\"z_long\"", "\"a_float\"", "\"b_half\"", "\"a_flag\""})
    pos.push_back(h.find(name));
  for (size_t i = 0; i + 1 < pos.size(); ++i)
    EXPECT_LT(pos[i], pos[i + 1]) << h;
  EXPECT_NE(h.find("\"c_long\":{\"dtype\":\"I64\",\"shape\":[1],\"data_offsets\":[0,8]}"),
            std::string::npos) << h;
}

TEST_F(safetensors_test, a_large_save_copied_by_several_threads_reads_back_bit_for_bit) {
  // Above 256 MiB of host tensors the data is copied into a shared mapping
  // of the file in 64 MiB pieces on several threads (a checkpoint's path);
  // pieces straddle tensors of odd sizes, and the order on disk is the
  // header's (dtype, then name).  ~300 MB, well under a second.
  std::map<std::string, at::Tensor> t;
  auto gen = at::make_generator<at::CPUGeneratorImpl>(7);
  t["b.big"] = at::randn({25'000'001}, gen);                          // 100 MB, not a multiple of a piece
  t["a.mid"] = at::randn({12'345, 1'001}, gen);                       // ~49 MB
  t["c.half"] = at::randn({40'000'003}, gen).to(at::kBFloat16);      // ~80 MB, another dtype
  t["d.ints"] = at::randint(0, 1 << 30, {20'000'000}, gen, at::kLong); // 160 MB
  t["e.tiny"] = at::arange(5, at::kFloat);
  const auto p = dir_ / "big.safetensors";
  save_safetensors(p, t, {{"format", "pt"}});
  EXPECT_FALSE(fs::exists(dir_ / "big.safetensors.tmp"));
  const auto back = load_safetensors(p);
  ASSERT_EQ(back.size(), t.size());
  for (const auto& [name, x] : t)
    EXPECT_TRUE(same_bytes(back.at(name), x)) << name;
}

TEST_F(safetensors_test, save_is_atomic_and_leaves_mapped_tensors_intact) {
  const auto p = dir_ / "w.safetensors";
  save_safetensors(p, {{"w", at::full({4}, 1.0f)}});
  auto old = load_safetensors(p).at("w");
  save_safetensors(p, {{"w", at::full({4}, 2.0f)}});
  EXPECT_FALSE(fs::exists(dir_ / "w.safetensors.tmp"));
  EXPECT_TRUE(at::equal(old, at::full({4}, 1.0f))) << "old mapping must survive the overwrite";
  EXPECT_TRUE(at::equal(load_safetensors(p).at("w"), at::full({4}, 2.0f)));

  // A failed save leaves the previous file as it was and no temporary behind.
  const auto before = read_bytes(p);
  expect_bad_input([&] { save_safetensors(p, {{"c", at::ones({2}, at::kComplexFloat)}}); },
                   {"w.safetensors", "'c'", "ComplexFloat"});
  EXPECT_EQ(read_bytes(p), before);
  EXPECT_FALSE(fs::exists(dir_ / "w.safetensors.tmp"));
}

// -------------------------------------------------------------- zero copy --

TEST_F(safetensors_test, tensors_alias_the_file_mapping_until_the_last_one_dies) {
  const auto p = dir_ / "z.safetensors";
  save_safetensors(p, {{"a", at::arange(1000, at::kFloat)}, {"b", at::arange(1000, at::kFloat)}});
  const uint64_t data_start = 8 + header_of(p).size();

  auto file = std::make_unique<safetensors_file>(read_safetensors(p));
  at::Tensor a = file->tensors.at("a");
  at::Tensor b = file->tensors.at("b");
  // Both views sit where the header puts them inside one mapping: b 4000 bytes after a.
  EXPECT_EQ(static_cast<char*>(b.data_ptr()) - static_cast<char*>(a.data_ptr()), 4000);
  EXPECT_TRUE(mapped_in_this_process(p));

  // Bytes written to the file show through the (never written) private mapping.
  const float v = 42.0f;
  int fd = ::open(p.c_str(), O_WRONLY);
  ASSERT_GE(fd, 0);
  ASSERT_EQ(::pwrite(fd, &v, sizeof v, static_cast<off_t>(data_start + 3 * sizeof(float))),
            static_cast<ssize_t>(sizeof v));
  ::close(fd);
  EXPECT_EQ(a[3].item<float>(), 42.0f) << "tensor is a copy, not a view of the mapping";

  file.reset();
  b.reset();
  EXPECT_TRUE(mapped_in_this_process(p)) << "unmapped while tensor 'a' still uses it";
  EXPECT_EQ(a[999].item<float>(), 999.0f);
  a.reset();
  EXPECT_FALSE(mapped_in_this_process(p)) << "mapping outlived its last tensor";
}

TEST_F(safetensors_test, misaligned_data_is_copied_not_aliased) {
  // A header whose length is not a multiple of 8 (the Python library and
  // save_safetensors never write one) leaves the data start misaligned.
  std::string header = R"({"x":{"dtype":"F64","shape":[2],"data_offsets":[0,16]}})";
  while ((8 + header.size()) % 8 != 3)
    header += ' ';
  const auto p = raw_file("m.safetensors", header, raw(std::vector<double>{1.5, -2.25}));
  auto x = load_safetensors(p).at("x");
  EXPECT_EQ(reinterpret_cast<uintptr_t>(x.data_ptr()) % alignof(double), 0u);
  EXPECT_EQ(x[0].item<double>(), 1.5);
  EXPECT_EQ(x[1].item<double>(), -2.25);
}

// ----------------------------------------------- directories and shards --

TEST_F(safetensors_test, loads_a_directory_holding_model_safetensors) {
  save_safetensors(dir_ / "model.safetensors", {{"w", sample(at::kFloat)}});
  EXPECT_TRUE(same_bytes(load_safetensors(dir_).at("w"), sample(at::kFloat)));
}

TEST_F(safetensors_test, loads_a_sharded_checkpoint_through_its_index) {
  save_safetensors(dir_ / "model-00001-of-00002.safetensors",
                   {{"a", sample(at::kFloat)}, {"b", sample(at::kBFloat16)}}, {{"format", "pt"}});
  save_safetensors(dir_ / "model-00002-of-00002.safetensors",
                   {{"c", sample(at::kLong)}, {"unlisted", at::ones({1})}}, {{"format", "pt"}});
  write_bytes(dir_ / "model.safetensors.index.json", R"({
    "metadata": {"total_size": 144},
    "weight_map": {"a": "model-00001-of-00002.safetensors",
                   "b": "model-00001-of-00002.safetensors",
                   "c": "model-00002-of-00002.safetensors"}})");
  for (const auto& p : {dir_, dir_ / "model.safetensors.index.json"}) {
    auto f = read_safetensors(p);
    ASSERT_EQ(f.tensors.size(), 3u) << "exactly the index's weight_map";
    EXPECT_TRUE(same_bytes(f.tensors.at("a"), sample(at::kFloat)));
    EXPECT_TRUE(same_bytes(f.tensors.at("b"), sample(at::kBFloat16)));
    EXPECT_TRUE(same_bytes(f.tensors.at("c"), sample(at::kLong)));
    EXPECT_EQ(f.metadata.at("total_size"), "144");
    EXPECT_EQ(f.metadata.at("format"), "pt");
  }
}

TEST_F(safetensors_test, index_naming_a_missing_shard_names_index_shard_and_tensor) {
  save_safetensors(dir_ / "model-00001-of-00002.safetensors", {{"a", at::ones({1})}});
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"a": "model-00001-of-00002.safetensors",
                                 "lm_head.weight": "model-00002-of-00002.safetensors"}})");
  expect_bad_input([&] { load_safetensors(dir_); },
                   {"model.safetensors.index.json", "model-00002-of-00002.safetensors",
                    "'lm_head.weight'"});
}

TEST_F(safetensors_test, index_naming_a_tensor_absent_from_its_shard_is_rejected) {
  save_safetensors(dir_ / "model-00001-of-00001.safetensors", {{"a", at::ones({1})}});
  write_bytes(dir_ / "model.safetensors.index.json",
              R"({"weight_map": {"a": "model-00001-of-00001.safetensors",
                                 "model.norm.weight": "model-00001-of-00001.safetensors"}})");
  expect_bad_input([&] { load_safetensors(dir_); },
                   {"model.safetensors.index.json", "'model.norm.weight'",
                    "model-00001-of-00001.safetensors"});
}

TEST_F(safetensors_test, malformed_index_is_rejected) {
  write_bytes(dir_ / "model.safetensors.index.json", "{\"weight_map\": ");
  expect_bad_input([&] { load_safetensors(dir_); }, {"model.safetensors.index.json", "JSON"});
  write_bytes(dir_ / "model.safetensors.index.json", R"({"metadata": {}})");
  expect_bad_input([&] { load_safetensors(dir_); },
                   {"model.safetensors.index.json", "'weight_map'"});
  write_bytes(dir_ / "model.safetensors.index.json", R"({"weight_map": {"a": 3}})");
  expect_bad_input([&] { load_safetensors(dir_); },
                   {"model.safetensors.index.json", "weight_map.a"});
}

TEST_F(safetensors_test, directory_without_a_checkpoint_is_rejected) {
  expect_bad_input([&] { load_safetensors(dir_); },
                   {dir_.string(), "model.safetensors", "model.safetensors.index.json"});
}

// -------------------------------------------------------------- bad input --

TEST_F(safetensors_test, missing_file_is_named) {
  expect_bad_input([&] { load_safetensors(dir_ / "absent.safetensors"); },
                   {"absent.safetensors", "no such file"});
}

TEST_F(safetensors_test, file_shorter_than_the_length_field_is_truncated) {
  write_bytes(dir_ / "tiny.safetensors", "abc");
  expect_bad_input([&] { load_safetensors(dir_ / "tiny.safetensors"); },
                   {"tiny.safetensors", "truncated"});
  write_bytes(dir_ / "zero.safetensors", "");
  expect_bad_input([&] { load_safetensors(dir_ / "zero.safetensors"); },
                   {"zero.safetensors", "truncated"});
}

TEST_F(safetensors_test, header_length_beyond_the_file_is_truncated) {
  const auto p = dir_ / "cut.safetensors";
  write_bytes(p, le64(4096) + R"({"x":{"dtype":"F32",)");
  expect_bad_input([&] { load_safetensors(p); }, {"cut.safetensors", "truncated", "4096"});
}

TEST_F(safetensors_test, header_that_is_not_json_is_rejected) {
  auto p = raw_file("nj.safetensors", R"({"x":{"dtype":"F32","shape":[1],)");
  expect_bad_input([&] { load_safetensors(p); }, {"nj.safetensors", "not valid JSON"});
  p = raw_file("arr.safetensors", "[1, 2]   ");
  expect_bad_input([&] { load_safetensors(p); }, {"arr.safetensors", "JSON object"});
}

TEST_F(safetensors_test, unknown_dtype_names_tensor_and_dtype) {
  auto p = raw_file("dt.safetensors",
                    R"({"model.embed":{"dtype":"F7","shape":[1],"data_offsets":[0,1]}})", "x");
  expect_bad_input([&] { load_safetensors(p); }, {"dt.safetensors", "'model.embed'", "'F7'"});
}

TEST_F(safetensors_test, shape_times_dtype_size_must_equal_the_offset_span) {
  auto p = raw_file("span.safetensors",
                    R"({"w":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})",
                    std::string(20, '\0'));
  expect_bad_input([&] { load_safetensors(p); },
                   {"span.safetensors", "'w'", "[2, 3]", "24 bytes", "span 20"});
}

TEST_F(safetensors_test, data_offsets_past_the_file_are_truncation) {
  const auto p = dir_ / "short.safetensors";
  save_safetensors(p, {{"a", at::ones({4})}, {"last", at::ones({64})}});
  auto bytes = read_bytes(p);
  write_bytes(p, bytes.substr(0, bytes.size() - 10));
  expect_bad_input([&] { load_safetensors(p); }, {"short.safetensors", "'last'", "truncated"});
}

TEST_F(safetensors_test, overlapping_offsets_name_both_tensors) {
  auto p = raw_file("ov.safetensors",
                    R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                    R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                    std::string(12, '\0'));
  expect_bad_input([&] { load_safetensors(p); }, {"ov.safetensors", "'b'", "overlap", "'a'"});
}

TEST_F(safetensors_test, reversed_offsets_gaps_and_unclaimed_bytes_are_rejected) {
  auto p = raw_file("rev.safetensors",
                    R"({"r":{"dtype":"U8","shape":[0],"data_offsets":[4,0]}})", "abcd");
  expect_bad_input([&] { load_safetensors(p); }, {"rev.safetensors", "'r'", "data_offsets"});
  p = raw_file("gap.safetensors",
               R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},)"
               R"("b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
               "abcdef");
  expect_bad_input([&] { load_safetensors(p); }, {"gap.safetensors", "'b'", "gap", "'a'"});
  p = raw_file("tail.safetensors", R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})",
               "abcdef");
  expect_bad_input([&] { load_safetensors(p); }, {"tail.safetensors", "4 bytes", "'a'"});
}

TEST_F(safetensors_test, malformed_entries_name_tensor_and_field) {
  struct bad {
    const char* header;
    std::vector<std::string> needles;
  };
  const std::vector<bad> cases = {
    {R"({"w":{"shape":[1],"data_offsets":[0,1]}})", {"'w'", "'dtype'"}},
    {R"({"w":{"dtype":"U8","data_offsets":[0,1]}})", {"'w'", "'shape'"}},
    {R"({"w":{"dtype":"U8","shape":[1]}})", {"'w'", "'data_offsets'"}},
    {R"({"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}})", {"'w'", "'shape'"}},
    {R"({"w":{"dtype":"U8","shape":[1],"data_offsets":[0]}})", {"'w'", "'data_offsets'"}},
    {R"({"w":{"dtype":8,"shape":[1],"data_offsets":[0,1]}})", {"'w'", "'dtype'"}},
    {R"({"w":[1]})", {"'w'"}},
    {R"({"__metadata__":{"step":12},"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1]}})",
     {"'__metadata__.step'", "string"}},
    {R"({"w":{"dtype":"U8","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,1]}})",
     {"'w'", "too large"}},
  };
  int i = 0;
  for (const auto& c : cases) {
    const auto name = "e" + std::to_string(i++) + ".safetensors";
    auto p = raw_file(name, c.header, "x");
    auto needles = c.needles;
    needles.push_back(name);
    SCOPED_TRACE(c.header);
    expect_bad_input([&] { load_safetensors(p); }, needles);
  }
}

TEST_F(safetensors_test, save_rejects_reserved_names_and_missing_directories) {
  expect_bad_input([&] { save_safetensors(dir_ / "r.safetensors", {{"__metadata__", at::ones({1})}}); },
                   {"r.safetensors", "__metadata__"});
  expect_bad_input([&] { save_safetensors(dir_ / "u.safetensors", {{"u", at::Tensor()}}); },
                   {"u.safetensors", "'u'"});
  expect_bad_input([&] { save_safetensors(dir_ / "no" / "such" / "d.safetensors", {}); },
                   {"d.safetensors"});
}

TEST_F(safetensors_test, require_tensor_names_file_tensor_and_expectation) {
  std::map<std::string, at::Tensor> t = {{"w", at::zeros({2, 3}, at::kBFloat16)}};
  EXPECT_TRUE(require_tensor(t, "w", {2, 3}, at::kBFloat16, "ck.safetensors").is_same(t["w"]));
  expect_bad_input([&] { require_tensor(t, "v", {2, 3}, at::kBFloat16, "ck.safetensors"); },
                   {"missing tensor v in ck.safetensors"});
  expect_bad_input([&] { require_tensor(t, "w", {3, 2}, at::kBFloat16, "ck.safetensors"); },
                   {"ck.safetensors", "'w'", "[2, 3]", "expected [3, 2]"});
  expect_bad_input([&] { require_tensor(t, "w", {2, 3}, at::kFloat, "ck.safetensors"); },
                   {"ck.safetensors", "'w'", "BF16", "expected F32"});
}

TEST(safetensors, dtype_names) {
  for (const auto& [name, type] : all_dtypes)
    EXPECT_EQ(safetensors_dtype_name(type), name);
  EXPECT_FALSE(safetensors_dtype_name(at::kComplexFloat).has_value());
}

// ------------------------------------------- cross-checks with Python --

/// The Python side: `write OUT` saves the sample tensors with the
/// safetensors library; `check IN OUT` loads IN with it, checks every sample
/// tensor and the metadata, and saves what it loaded to OUT.
const char* python_script = R"PY(
import sys, torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

DTYPES = {"F64": torch.float64, "F32": torch.float32, "BF16": torch.bfloat16,
          "F16": torch.float16, "F8_E4M3": torch.float8_e4m3fn, "F8_E5M2": torch.float8_e5m2,
          "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
          "U64": torch.uint64, "U32": torch.uint32, "U16": torch.uint16, "U8": torch.uint8,
          "BOOL": torch.bool}

def sample(name):
    d = DTYPES[name]
    b = torch.arange(-5, 7).reshape(3, 4)
    if d == torch.bool:
        return b.remainder(3) == 0
    if name in ("U8", "U16", "U32", "U64"):
        return (b + 5).to(d)
    return b.to(torch.float32).to(d)

def samples():
    out = {"t_" + n: sample(n) for n in DTYPES}
    out["scalar"] = torch.tensor(2.5)
    out["empty"] = torch.zeros(0, 3, dtype=torch.bfloat16)
    out["transposed"] = sample("F32").t().contiguous()
    return out

def raw(t):
    return t.contiguous().reshape(-1).view(torch.uint8)

if sys.argv[1] == "write":
    out = samples()
    out["random_bf16"] = torch.randn(17, 33, generator=torch.Generator().manual_seed(7)).to(torch.bfloat16)
    save_file(out, sys.argv[2], metadata={"format": "pt"})
else:
    got = load_file(sys.argv[2])
    with safe_open(sys.argv[2], framework="pt") as f:
        meta = f.metadata()
    assert meta == {"format": "pt"}, meta
    want = samples()
    for name, t in want.items():
        g = got[name]
        assert g.dtype == t.dtype and g.shape == t.shape, (name, g.dtype, g.shape)
        assert torch.equal(raw(g), raw(t)), name
    r = got["random_bf16"]
    assert r.dtype == torch.bfloat16 and r.shape == (17, 33), (r.dtype, r.shape)
    assert sorted(got) == sorted(list(want) + ["random_bf16"]), sorted(got)
    save_file(got, sys.argv[3], metadata=meta)
print("ok")
)PY";

std::map<std::string, at::Tensor> samples() {
  std::map<std::string, at::Tensor> out;
  for (const auto& [name, type] : all_dtypes)
    out["t_" + name] = sample(type);
  out["scalar"] = at::scalar_tensor(2.5, at::kFloat);
  out["empty"] = at::zeros({0, 3}, at::kBFloat16);
  out["transposed"] = sample(at::kFloat).t();  // written from a non-contiguous view
  return out;
}

TEST_F(safetensors_test, python_written_file_reads_in_tandem_and_rewrites_byte_identical) {
  write_bytes(dir_ / "script.py", python_script);
  const auto py = dir_ / "py.safetensors";
  auto [rc, out] = run_python("'" + (dir_ / "script.py").string() + "' write '" + py.string() + "'");
  ASSERT_EQ(rc, 0) << out;

  auto f = read_safetensors(py);
  EXPECT_EQ(f.metadata, (std::map<std::string, std::string>{{"format", "pt"}}));
  for (const auto& [name, t] : samples()) {
    ASSERT_TRUE(f.tensors.count(name)) << name;
    EXPECT_TRUE(same_bytes(f.tensors[name], t.contiguous())) << name;
  }
  ASSERT_TRUE(f.tensors.count("random_bf16"));
  EXPECT_EQ(f.tensors["random_bf16"].scalar_type(), at::kBFloat16);

  // Tandem's writer lays the same tensors out exactly as the Python library.
  const auto ours = dir_ / "ours.safetensors";
  save_safetensors(ours, f.tensors, f.metadata);
  EXPECT_EQ(read_bytes(ours), read_bytes(py)) << "header: " << header_of(ours)
                                              << "\npython: " << header_of(py);
}

TEST_F(safetensors_test, tandem_written_file_reads_in_python) {
  write_bytes(dir_ / "script.py", python_script);
  at::manual_seed(3);
  auto in = samples();
  in["random_bf16"] = at::randn({17, 33}).to(at::kBFloat16);
  const auto ours = dir_ / "ours.safetensors";
  const auto back = dir_ / "back.safetensors";
  save_safetensors(ours, in, {{"format", "pt"}});
  auto [rc, out] = run_python("'" + (dir_ / "script.py").string() + "' check '" + ours.string()
                              + "' '" + back.string() + "'");
  ASSERT_EQ(rc, 0) << out;
  auto again = load_safetensors(back);
  ASSERT_EQ(again.size(), in.size());
  for (const auto& [name, t] : in)
    EXPECT_TRUE(same_bytes(again.at(name), t.contiguous())) << name;
}

} // namespace

// ------------------------------------------- a target that fits its config --

namespace {

/// A tiny Qwen3 folder (config.json + model.safetensors) written in C++:
/// V 32, D 16, I 32, 2 heads of 8, 1 KV head, `layers` layers, tied head.
std::map<std::string, at::Tensor> tiny_qwen3_tensors(int64_t layers) {
  auto r = [](at::IntArrayRef shape) { return at::randn(shape); };
  std::map<std::string, at::Tensor> t{{"model.embed_tokens.weight", r({32, 16})},
                                      {"model.norm.weight", r({16})}};
  for (int64_t i = 0; i < layers; ++i) {
    const auto p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = r({16});
    t[p + "post_attention_layernorm.weight"] = r({16});
    t[p + "self_attn.q_proj.weight"] = r({16, 16});
    t[p + "self_attn.k_proj.weight"] = r({8, 16});
    t[p + "self_attn.v_proj.weight"] = r({8, 16});
    t[p + "self_attn.o_proj.weight"] = r({16, 16});
    t[p + "self_attn.q_norm.weight"] = r({8});
    t[p + "self_attn.k_norm.weight"] = r({8});
    t[p + "mlp.gate_proj.weight"] = r({32, 16});
    t[p + "mlp.up_proj.weight"] = r({32, 16});
    t[p + "mlp.down_proj.weight"] = r({16, 32});
  }
  return t;
}

std::string tiny_qwen3_config(int64_t layers) {
  return "{\"architectures\": [\"Qwen3ForCausalLM\"], \"vocab_size\": 32, \"hidden_size\": 16, "
         "\"intermediate_size\": 32, \"num_hidden_layers\": " + std::to_string(layers)
         + ", \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 8, "
           "\"tie_word_embeddings\": true}";
}

} // namespace

TEST_F(safetensors_test, a_target_whose_weights_do_not_match_its_config_names_file_and_tensor) {
  // Issue 19: a tensor's shape other than config.json implies, a missing
  // tensor, more layers than the config, a truncated file: each a
  // bad_input at load naming the weights' file and the tensor.
  const auto model = dir_ / "target";
  fs::create_directories(model);
  const auto weights = model / "model.safetensors";
  const auto config = model / "config.json";
  auto load = [&] { return qwen3_target::load(model, at::kCPU, at::kFloat, {0, 1}, true); };
  write_bytes(config, tiny_qwen3_config(2));
  auto t = tiny_qwen3_tensors(2);
  save_safetensors(weights, t);
  EXPECT_EQ(load().config().num_hidden_layers, 2);

  auto bad = t;
  bad["model.layers.1.self_attn.k_proj.weight"] = at::randn({16, 16});  // 2 KV heads' worth
  save_safetensors(weights, bad);
  expect_bad_input(load, {weights.string(), "tensor model.layers.1.self_attn.k_proj.weight",
                          "has shape [16, 16], expected [8, 16]", "do not match the config"});

  bad = t;
  bad.erase("model.layers.1.mlp.up_proj.weight");
  save_safetensors(weights, bad);
  expect_bad_input(load, {"missing tensor model.layers.1.mlp.up_proj.weight in " + weights.string()});

  bad = t;
  bad["model.embed_tokens.weight"] = at::randn({31, 16});  // a tokenizer's length, not the config's
  save_safetensors(weights, bad);
  expect_bad_input(load, {weights.string(), "model.embed_tokens.weight", "[31, 16]", "[32, 16]"});

  // Three layers of weights, a config of two.
  save_safetensors(weights, tiny_qwen3_tensors(3));
  expect_bad_input(load, {"tensor model.layers.2.", "in " + weights.string(),
                          "a layer past config.json's num_hidden_layers = 2"});

  save_safetensors(weights, t);
  const auto bytes = read_bytes(weights);
  write_bytes(weights, bytes.substr(0, bytes.size() / 2));
  expect_bad_input(load, {weights.string(), "truncated"});
}
