// torch.save's files: the zip archive, the protocol-2 pickle machine, and write -> read round trips.
//
// The fixture tests/data/megatron/tp1/.../model_optim_rng.pt was written by torch 1.13's torch.save
// (tools/reference/megatron_ckpt_reference.py). Malformed input must give an error naming the file,
// never a crash: every prefix of a real pickle and every single-byte corruption of it is parsed.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "ckpt/pickle.h"
#include "ckpt/temp_dir.h"
#include "ckpt/torch_file.h"
#include "ckpt/zip_archive.h"
#include "core/dtype.h"

namespace gale {
namespace {

using testing_util::TempDir;

std::string fixture_pt() {
  return std::string(GALE_TEST_DATA_DIR) + "/megatron/tp1/iter_0000007/mp_rank_00/model_optim_rng.pt";
}

std::string slurp(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(TorchFile, ReadsTorchSavesMegatronStateDict) {
  auto root = read_torch_file(fixture_pt());
  ASSERT_TRUE(root.ok()) << root.status().message();
  EXPECT_EQ((*root)->kind, PyValue::kDict);
  EXPECT_EQ((*root)->get("iteration")->i, 7);
  EXPECT_EQ((*root)->get("checkpoint_version")->f, 3.0);
  const PyValue* args = (*root)->get("args");
  ASSERT_TRUE(args != nullptr);
  EXPECT_EQ(args->s, "argparse.Namespace");
  EXPECT_EQ(args->attr("num_layers")->i, 4);
  EXPECT_EQ(args->attr("normalization")->s, "LayerNorm");
  EXPECT_EQ(args->attr("params_dtype")->kind, PyValue::kGlobal);
  EXPECT_EQ(args->attr("params_dtype")->s, "torch.float32");
  EXPECT_EQ(args->attr("virtual_pipeline_model_parallel_size")->kind, PyValue::kNone);
  const PyValue* qkv = (*root)->get("model")->get("decoder.layers.0.self_attention.linear_qkv.weight");
  ASSERT_TRUE(qkv != nullptr);
  EXPECT_EQ(qkv->kind, PyValue::kTensor);
  EXPECT_EQ(qkv->data.shape(), (Shape{64, 32}));  // 4 query heads + 2 x 2 key/value heads of 8
  EXPECT_EQ(qkv->data.dtype(), DType::kF32);
}

TEST(TorchFile, WriteThenReadRoundTrips) {
  TempDir tmp;
  PyRef ns = PyValue::dict();
  ns->set("small", PyValue::integer(200));
  ns->set("medium", PyValue::integer(60000));
  ns->set("negative", PyValue::integer(-5));
  ns->set("large", PyValue::integer(int64_t{1} << 40));
  ns->set("very_negative", PyValue::integer(-(int64_t{1} << 40)));
  ns->set("pi", PyValue::real(3.141592653589793));
  ns->set("flag", PyValue::boolean(true));
  ns->set("nothing", PyValue::none());
  ns->set("name", PyValue::str("ünïcode"));
  ns->set("dtype", PyValue::global("torch.bfloat16"));
  PyRef list = PyValue::list();
  list->items = {PyValue::integer(1), PyValue::tuple({PyValue::str("a"), PyValue::real(-0.5)})};
  ns->set("list", list);
  Tensor f = Tensor::empty({3, 2});
  for (int i = 0; i < 6; ++i) f.data<float>()[i] = 0.25f * static_cast<float>(i) - 1.0f;
  Tensor b = Tensor::empty({5}, DType::kBF16);
  for (int i = 0; i < 5; ++i) b.data<bf16>()[i] = float_to_bf16(static_cast<float>(i));
  PyRef model = PyValue::ordered_dict();  // a state_dict(): collections.OrderedDict
  model->set("w", PyValue::tensor(f));
  model->set("b", PyValue::tensor(b));
  PyRef root = PyValue::dict();
  root->set("args", PyValue::object("argparse.Namespace", ns));
  root->set("model", model);
  ASSERT_TRUE(write_torch_file(tmp.file("x.pt"), *root).ok());
  auto back = read_torch_file(tmp.file("x.pt"));
  ASSERT_TRUE(back.ok()) << back.status().message();
  const PyValue* a = (*back)->get("args");
  EXPECT_EQ(a->attr("small")->i, 200);
  EXPECT_EQ(a->attr("medium")->i, 60000);
  EXPECT_EQ(a->attr("negative")->i, -5);
  EXPECT_EQ(a->attr("large")->i, int64_t{1} << 40);
  EXPECT_EQ(a->attr("very_negative")->i, -(int64_t{1} << 40));
  EXPECT_EQ(a->attr("pi")->f, 3.141592653589793);
  EXPECT_TRUE(a->attr("flag")->b);
  EXPECT_EQ(a->attr("nothing")->kind, PyValue::kNone);
  EXPECT_EQ(a->attr("name")->s, "ünïcode");
  EXPECT_EQ(a->attr("dtype")->s, "torch.bfloat16");
  EXPECT_EQ(a->attr("list")->items[1]->items[1]->f, -0.5);
  EXPECT_TRUE((*back)->get("model")->ordered);
  EXPECT_FALSE((*back)->ordered);
  EXPECT_EQ((*back)->get("model")->entries.at(0).first->s, "w");  // insertion order kept
  const PyValue* w = (*back)->get("model")->get("w");
  EXPECT_EQ(w->data.shape(), (Shape{3, 2}));
  EXPECT_EQ(std::memcmp(w->data.raw(), f.raw(), f.nbytes()), 0);
  const PyValue* bb = (*back)->get("model")->get("b");
  EXPECT_EQ(bb->data.dtype(), DType::kBF16);
  EXPECT_EQ(std::memcmp(bb->data.raw(), b.raw(), b.nbytes()), 0);
  // Entries are stored with their data 64-byte aligned, as torch writes them.
  auto z = ZipArchive::open(tmp.file("x.pt"));
  ASSERT_TRUE(z.ok());
  const std::string bytes = slurp(tmp.file("x.pt"));
  auto u16 = [&](size_t at) { return static_cast<size_t>(static_cast<uint8_t>(bytes[at])) | (static_cast<size_t>(static_cast<uint8_t>(bytes[at + 1])) << 8); };
  size_t at = 0;
  for (const std::string& name : z->names()) {
    ASSERT_EQ(bytes.compare(at, 4, "PK\x03\x04"), 0) << name;
    const size_t data = at + 30 + u16(at + 26) + u16(at + 28);
    EXPECT_EQ(data % 64, 0u) << name;
    at = data + z->entry(name).value().size();
  }
  EXPECT_EQ(z->names()[0], "x/data.pkl");
  EXPECT_EQ(z->entry("x/version").value(), "3\n");
  EXPECT_EQ(z->entry("x/byteorder").value(), "little");
}

TEST(Pickle, UnknownClassesBecomeOpaqueObjects) {
  const std::string pkl = std::string("\x80\x02") + "cfoo.bar\nBaz\n" + "K\x07\x85R" + std::string("}X\x01\0\0\0aK\x01sb.", 12);
  auto v = parse_pickle(pkl, "t.pkl");
  ASSERT_TRUE(v.ok()) << v.status().message();
  EXPECT_EQ((*v)->kind, PyValue::kObject);
  EXPECT_EQ((*v)->s, "foo.bar.Baz");
  EXPECT_EQ((*v)->items[0]->i, 7);
  EXPECT_EQ((*v)->attr("a")->i, 1);
}

TEST(Pickle, ErrorsNameTheFileOffsetAndOpcode) {
  auto v = parse_pickle(std::string("\x80\x02K\x01\xff.", 6), "bad.pkl");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("bad.pkl: pickle opcode 0xff at byte 4: unsupported opcode"), std::string::npos)
      << v.status().message();
  v = parse_pickle(std::string("\x80\x02K", 3), "short.pkl");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("short.pkl"), std::string::npos);
  v = parse_pickle(std::string("\x80\x02s.", 4), "under.pkl");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("stack underflow"), std::string::npos) << v.status().message();
}

// Reference cycles (a list holding itself through the memo) and deep nesting are errors, not a
// leak or a stack overflow when the values are freed.
TEST(Pickle, CyclesAndDeepNestingAreRefused) {
  auto v = parse_pickle(std::string("\x80\x02]q\x00" "h\x00" "a.", 9), "cycle.pkl");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("refer to themselves"), std::string::npos) << v.status().message();
  v = parse_pickle("\x80\x02N" + std::string(100000, '\x85') + ".", "deep.pkl");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("nest deeper than 256 levels"), std::string::npos) << v.status().message();
  v = parse_pickle("\x80\x02N" + std::string(200, '\x85') + ".", "fine.pkl");
  EXPECT_TRUE(v.ok()) << v.status().message();
}

// A cheap deterministic fuzz: every prefix and every single-byte corruption of a real data.pkl.
TEST(Pickle, TruncatedOrCorruptedPicklesNeverCrash) {
  auto z = ZipArchive::open(fixture_pt());
  ASSERT_TRUE(z.ok());
  const std::string pkl(z->entry("model_optim_rng/data.pkl").value());
  ASSERT_TRUE(parse_pickle(pkl, "ok").ok());
  for (size_t n = 0; n < pkl.size(); ++n) EXPECT_FALSE(parse_pickle(pkl.substr(0, n), "prefix").ok()) << n;
  for (size_t k = 0; k < pkl.size(); ++k) {
    std::string bad = pkl;
    bad[k] = static_cast<char>(bad[k] ^ 0x5a);
    (void)parse_pickle(bad, "flipped");  // ok or an error; never a crash
  }
}

TEST(ZipArchive, RefusesNonZipTruncatedAndCompressedInput) {
  auto z = ZipArchive::from_bytes("hello, not a zip archive at all", "plain.txt");
  ASSERT_FALSE(z.ok());
  EXPECT_NE(z.status().message().find("plain.txt: expected a zip archive (torch.save's format)"), std::string::npos)
      << z.status().message();
  ZipWriter w;
  w.add("a/data.pkl", "\x80\x02N.");
  w.add("a/data/0", std::string(100, 'x'));
  std::string bytes = w.finish().value();
  auto ok = ZipArchive::from_bytes(bytes, "w.zip");
  ASSERT_TRUE(ok.ok()) << ok.status().message();
  EXPECT_EQ(ok->entry("a/data/0").value(), std::string(100, 'x'));
  EXPECT_FALSE(ok->entry("a/missing").ok());
  // Every truncation is an error, never a crash.
  for (size_t n = 0; n < bytes.size(); ++n) EXPECT_FALSE(ZipArchive::from_bytes(bytes.substr(0, n), "cut").ok()) << n;
  // Deflated entries (method 8): not supported yet.
  std::string deflated = bytes;
  for (size_t at = 0; at + 4 <= deflated.size(); ++at)
    if (std::memcmp(deflated.data() + at, "PK\x01\x02", 4) == 0) deflated[at + 10] = 8;
  auto c = ZipArchive::from_bytes(deflated, "deflated.zip");
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("deflated.zip: entry 'a/data.pkl' is compressed (method 8)"), std::string::npos)
      << c.status().message();
}

TEST(TorchFile, ALegacyNonZipFileIsRefused) {
  auto v = read_torch_bytes(std::string("\x80\x02\x8a\x0al\xfc\x9cF\xf9 j\xa8P\x19.", 16), "old.pt");
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.status().message().find("old.pt: a torch.save file in the legacy (pre-1.6, non-zip) format: not supported yet"),
            std::string::npos)
      << v.status().message();
}

}  // namespace
}  // namespace gale
