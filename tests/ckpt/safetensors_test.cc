// Safetensors reader and writer: files written by the Python package, byte-identical output, round trips, corrupt
// input.
#include "ckpt/safetensors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>

#include "ckpt/atomic_file.h"
#include "temp_dir.h"

namespace gale {
namespace {

using testing_util::read_bytes;
using testing_util::TempDir;
using testing_util::write_bytes;

const std::string kFixtureDir = std::string(GALE_TEST_DATA_DIR) + "/safetensors";
const std::string kHfFile = kFixtureDir + "/hf_dtypes.safetensors";

nlohmann::json load_expected() {
  std::string text = read_bytes(kFixtureDir + "/hf_dtypes.json");
  return nlohmann::json::parse(text);
}

double json_double(const nlohmann::json& v) {
  if (v.is_string()) {
    std::string s = v.get<std::string>();
    if (s == "nan") return std::numeric_limits<double>::quiet_NaN();
    if (s == "inf") return std::numeric_limits<double>::infinity();
    if (s == "-inf") return -std::numeric_limits<double>::infinity();
  }
  return v.get<double>();
}

// A file of raw parts: 8-byte length, the header text as given, then the buffer.
std::string raw_file(const std::string& header, const std::string& buffer) {
  uint64_t n = header.size();
  std::string out(reinterpret_cast<const char*>(&n), 8);
  return out + header + buffer;
}

TEST(Safetensors, ReadsEveryDtypeWrittenByThePythonPackage) {
  nlohmann::json expected = load_expected();
  StatusOr<SafetensorsFile> f = SafetensorsFile::open(kHfFile);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata().size(), 1u);
  EXPECT_EQ(f->metadata().at("producer"), expected["metadata"]["producer"].get<std::string>());
  ASSERT_EQ(f->entries().size(), expected["tensors"].size());
  for (const nlohmann::json& t : expected["tensors"]) {
    std::string name = t["name"];
    SCOPED_TRACE(name);
    const SafetensorsEntry* e = f->find(name);
    ASSERT_NE(e, nullptr);
    EXPECT_EQ(st_dtype_name(e->dtype), t["dtype"].get<std::string>());
    EXPECT_EQ(e->shape, t["shape"].get<Shape>());
    const nlohmann::json& values = t["values"];
    ASSERT_EQ(e->numel(), static_cast<int64_t>(values.size()));
    if (st_dtype_is_float(e->dtype)) {
      StatusOr<Tensor> x = f->read(name, DType::kF64);
      ASSERT_TRUE(x.ok()) << x.status().to_string();
      for (size_t i = 0; i < values.size(); ++i) {
        double want = json_double(values[i]);
        double got = x->data<double>()[i];
        if (std::isnan(want)) {
          EXPECT_TRUE(std::isnan(got)) << i;
        } else {
          EXPECT_EQ(got, want) << i;
          EXPECT_EQ(std::signbit(got), std::signbit(want)) << i;
        }
      }
    } else {
      StatusOr<Tensor> x = f->read(name, DType::kI64);
      ASSERT_TRUE(x.ok()) << x.status().to_string();
      for (size_t i = 0; i < values.size(); ++i) EXPECT_EQ(x->data<int64_t>()[i], values[i].get<int64_t>()) << i;
    }
  }
}

TEST(Safetensors, NativeReadsKeepTheStoredDtype) {
  StatusOr<SafetensorsFile> f = SafetensorsFile::open(kHfFile);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  StatusOr<Tensor> cube = f->read("f32.cube");
  ASSERT_TRUE(cube.ok());
  EXPECT_EQ(cube->dtype(), DType::kF32);
  EXPECT_EQ(cube->shape(), (Shape{2, 2, 3}));
  EXPECT_EQ(cube->data<float>()[5], 0.25f);
  StatusOr<Tensor> b = f->read("bf16.vector");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->dtype(), DType::kBF16);
  EXPECT_EQ(bf16_to_float(b->data<bf16>()[2]), -1.5f);
  EXPECT_EQ(std::memcmp(b->raw(), f->data(*f->find("bf16.vector")), 16), 0);
  StatusOr<Tensor> flag = f->read("bool.vector");
  ASSERT_TRUE(flag.ok());
  EXPECT_EQ(flag->dtype(), DType::kU8);
  StatusOr<Tensor> scalar = f->read("f32.scalar");
  ASSERT_TRUE(scalar.ok());
  EXPECT_EQ(scalar->ndim(), 0);
  EXPECT_EQ(scalar->data<float>()[0], 42.5f);
  StatusOr<Tensor> empty = f->read("f32.empty");
  ASSERT_TRUE(empty.ok());
  EXPECT_EQ(empty->shape(), (Shape{0, 3}));

  // F16 reads natively as Gale's f16 (the same bits), and converted to f32 (subnormal exact).
  StatusOr<Tensor> half = f->read("f16.vector");
  ASSERT_TRUE(half.ok()) << half.status().message();
  EXPECT_EQ(half->dtype(), DType::kF16);
  EXPECT_EQ(f16_to_float(half->data<f16>()[4]), 65504.0f);
  StatusOr<Tensor> half32 = f->read("f16.vector", DType::kF32);
  ASSERT_TRUE(half32.ok());
  EXPECT_EQ(half32->data<float>()[6], std::ldexp(1.0f, -24));
  EXPECT_EQ(half32->data<float>()[4], 65504.0f);

  // Conversions that lose meaning are refused, naming the tensor.
  StatusOr<Tensor> bad = f->read("f32.cube", DType::kI64);
  EXPECT_EQ(bad.status().code(), StatusCode::kUnimplemented);
  StatusOr<Tensor> narrow = f->read("i64.vector", DType::kI32);
  EXPECT_EQ(narrow.status().code(), StatusCode::kOutOfRange);
  EXPECT_NE(narrow.status().message().find("i64.vector"), std::string::npos);
  StatusOr<Tensor> missing = f->read("nope");
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), kHfFile + ": no tensor 'nope'");
}

TEST(Safetensors, WriterReproducesThePythonPackageByteForByte) {
  StatusOr<SafetensorsFile> f = SafetensorsFile::open(kHfFile);
  ASSERT_TRUE(f.ok());
  SafetensorsWriter w;
  // Add in reverse data order: the writer must find the package's order itself.
  for (auto it = f->entries().rbegin(); it != f->entries().rend(); ++it)
    ASSERT_TRUE(w.add_raw(it->name, it->dtype, it->shape, f->data(*it)).ok());
  for (const auto& [k, v] : f->metadata()) w.set_metadata(k, v);
  TempDir dir;
  StatusOr<SafetensorsWriteResult> r = w.write(dir.file("copy.safetensors"));
  ASSERT_TRUE(r.ok()) << r.status().to_string();
  std::string ours = read_bytes(dir.file("copy.safetensors"));
  std::string theirs = read_bytes(kHfFile);
  EXPECT_EQ(ours, theirs);
  EXPECT_EQ(r->bytes, theirs.size());
  EXPECT_EQ(r->crc32, crc32_update(0, theirs.data(), theirs.size()));
}

TEST(Safetensors, RoundTripsGaleTensorsAtomically) {
  TempDir dir;
  Tensor a = Tensor::empty({3, 5});
  for (int i = 0; i < 15; ++i) a.data<float>()[i] = 0.5f * static_cast<float>(i) - 3.0f;
  Tensor b = Tensor::empty({7}, DType::kBF16);
  for (int i = 0; i < 7; ++i) b.data<bf16>()[i] = float_to_bf16(static_cast<float>(i) / 3.0f);
  Tensor c = Tensor::empty({2, 2}, DType::kI64);
  for (int i = 0; i < 4; ++i) c.data<int64_t>()[i] = int64_t{1} << (20 * i);
  SafetensorsWriter w;
  ASSERT_TRUE(w.add("b.bf16", b).ok());
  ASSERT_TRUE(w.add("a.f32", a).ok());
  ASSERT_TRUE(w.add("c.i64", c).ok());
  w.set_metadata("note", "round trip");
  std::string path = dir.file("rt.safetensors");
  write_bytes(path, "old content that must be replaced whole");
  ASSERT_TRUE(w.write(path).ok());
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));

  StatusOr<SafetensorsFile> f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.status().to_string();
  EXPECT_EQ(f->header_bytes() % 8, 0u);
  EXPECT_EQ(f->metadata().at("note"), "round trip");
  // Widest dtype first, so every tensor is aligned to its element size.
  ASSERT_EQ(f->entries().size(), 3u);
  EXPECT_EQ(f->entries()[0].name, "c.i64");
  EXPECT_EQ(f->entries()[1].name, "a.f32");
  EXPECT_EQ(f->entries()[2].name, "b.bf16");
  for (const Tensor* t : {&a, &b, &c}) {
    const char* name = t == &a ? "a.f32" : t == &b ? "b.bf16" : "c.i64";
    StatusOr<Tensor> back = f->read(name);
    ASSERT_TRUE(back.ok()) << name;
    EXPECT_EQ(back->dtype(), t->dtype());
    EXPECT_EQ(back->shape(), t->shape());
    EXPECT_EQ(std::memcmp(back->raw(), t->raw(), t->nbytes()), 0) << name;
  }
  StatusOr<Tensor> widened = f->read("b.bf16", DType::kF32);
  ASSERT_TRUE(widened.ok());
  EXPECT_EQ(widened->data<float>()[3], bf16_to_float(float_to_bf16(1.0f)));
}

TEST(Safetensors, WriterRejectsBadNamesAndUnwritablePaths) {
  SafetensorsWriter w;
  Tensor t = Tensor::zeros({2});
  EXPECT_TRUE(w.add("x", t).ok());
  EXPECT_EQ(w.add("x", t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("__metadata__", t).code(), StatusCode::kInvalidArgument);
  EXPECT_EQ(w.add("", t).code(), StatusCode::kInvalidArgument);
  StatusOr<SafetensorsWriteResult> r = w.write("/nonexistent-dir/x.safetensors");
  EXPECT_EQ(r.status().code(), StatusCode::kIOError);
  EXPECT_NE(r.status().message().find("/nonexistent-dir/x.safetensors"), std::string::npos);
}

struct CorruptCase {
  const char* label;
  std::string bytes;
  const char* message;  // expected message after "<path>: "
};

TEST(Safetensors, CorruptFilesGiveOneLineErrorsNamingFileAndTensor) {
  const std::string f32x = R"("x":{"dtype":"F32","shape":[10],"data_offsets":[0,40]})";
  std::vector<CorruptCase> cases = {
      {"short", "abc", "file is 3 bytes, shorter than the 8-byte header length"},
      {"huge header", raw_file("{}", "").replace(0, 8, std::string("\xff\xff\xff\xff\x00\x00\x00\x00", 8)),
       "header length 4294967295 exceeds the 100000000-byte limit (not a safetensors file?)"},
      {"header past end", raw_file("{}", "").replace(0, 1, "\x40"),
       "header length 64 exceeds the 2 bytes after the length (truncated file?)"},
      {"offsets past buffer", raw_file("{" + f32x + "}", std::string(32, '\0')),
       "tensor 'x' data_offsets [0, 40) exceed the 32-byte buffer"},
      {"size mismatch", raw_file(R"({"x":{"dtype":"F32","shape":[2,3],"data_offsets":[0,20]}})", std::string(20, '\0')),
       "tensor 'x': shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20) span 20"},
      {"overlap",
       raw_file(
           R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4]},"b":{"dtype":"U8","shape":[4],"data_offsets":[2,6]}})",
           std::string(6, '\0')),
       "tensors 'a' [0, 4) and 'b' [2, 6) overlap"},
      {"hole",
       raw_file(
           R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]},"b":{"dtype":"U8","shape":[2],"data_offsets":[4,6]}})",
           std::string(6, '\0')),
       "bytes [2, 4) of the buffer belong to no tensor (before 'b')"},
      {"trailing", raw_file(R"({"a":{"dtype":"U8","shape":[2],"data_offsets":[0,2]}})", std::string(5, '\0')),
       "the 5-byte buffer has 3 bytes after the last tensor's data"},
      {"unknown dtype", raw_file(R"({"a":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})", std::string(16, '\0')),
       "tensor 'a': unknown dtype 'F128'"},
      {"negative shape", raw_file(R"({"a":{"dtype":"U8","shape":[-1],"data_offsets":[0,0]}})", ""),
       "tensor 'a': shape [-1] must hold non-negative integers"},
      {"missing field", raw_file(R"({"a":{"dtype":"U8","shape":[1]}})", std::string(1, '\0')),
       "tensor 'a': missing field 'data_offsets'"},
      {"reversed offsets", raw_file(R"({"a":{"dtype":"U8","shape":[0],"data_offsets":[3,1]}})", std::string(3, '\0')),
       "tensor 'a': data_offsets [3, 1] end before they begin"},
      {"metadata not string", raw_file(R"({"__metadata__":{"k":1}})", ""),
       "__metadata__ value of 'k' must be a string, found 1"},
      {"not an object", raw_file("[1,2]   ", ""), "header is not a JSON object"},
  };
  TempDir dir;
  for (const CorruptCase& c : cases) {
    SCOPED_TRACE(c.label);
    std::string path = dir.file("bad.safetensors");
    write_bytes(path, c.bytes);
    StatusOr<SafetensorsFile> f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.ok());
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss);
    EXPECT_EQ(f.status().message(), path + ": " + c.message);
    EXPECT_EQ(f.status().message().find('\n'), std::string::npos);
  }
  // The example of the format doc, verbatim.
  std::string path = dir.file("model.safetensors");
  write_bytes(path, raw_file("{" + f32x + "}", std::string(32, '\0')));
  EXPECT_EQ(SafetensorsFile::open(path).status().to_string(),
            "DataLoss: " + path + ": tensor 'x' data_offsets [0, 40) exceed the 32-byte buffer");
  // Not JSON at all.
  write_bytes(path, raw_file("garbage!", ""));
  StatusOr<SafetensorsFile> garbage = SafetensorsFile::open(path);
  EXPECT_EQ(garbage.status().code(), StatusCode::kDataLoss);
  EXPECT_NE(garbage.status().message().find("header is not valid JSON"), std::string::npos);
  // Missing file.
  StatusOr<SafetensorsFile> missing = SafetensorsFile::open(dir.file("absent.safetensors"));
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_EQ(missing.status().message(), dir.file("absent.safetensors") + ": no such file");
}

TEST(Safetensors, EveryTruncationOfAValidFileIsDetected) {
  std::string whole = read_bytes(kHfFile);
  TempDir dir;
  std::string path = dir.file("cut.safetensors");
  for (size_t len = 0; len < whole.size(); ++len) {
    write_bytes(path, whole.substr(0, len));
    StatusOr<SafetensorsFile> f = SafetensorsFile::open(path);
    ASSERT_FALSE(f.ok()) << "a file cut to " << len << " of " << whole.size() << " bytes was accepted";
    EXPECT_EQ(f.status().code(), StatusCode::kDataLoss) << len;
  }
}

TEST(Safetensors, HalfToFloatCoversEveryClass) {
  EXPECT_EQ(half_to_float(0x3c00), 1.0f);
  EXPECT_EQ(half_to_float(0xc000), -2.0f);
  EXPECT_EQ(half_to_float(0x7bff), 65504.0f);
  EXPECT_EQ(half_to_float(0x0400), std::ldexp(1.0f, -14));
  EXPECT_EQ(half_to_float(0x0001), std::ldexp(1.0f, -24));
  EXPECT_EQ(half_to_float(0x03ff), 1023.0f * std::ldexp(1.0f, -24));
  EXPECT_TRUE(std::signbit(half_to_float(0x8000)));
  EXPECT_EQ(half_to_float(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::isnan(half_to_float(0x7e00)));
}

}  // namespace
}  // namespace gale
