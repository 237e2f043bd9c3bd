// libFuzzer target: torch.save files (zip archive + protocol-2 pickle + storages), bare pickles and DCP .metadata on arbitrary bytes.
// Whatever parses must be consistent: every tensor's data has its shape's element count.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "ckpt/dcp_reader.h"
#include "ckpt/pickle.h"
#include "ckpt/torch_file.h"

namespace {

void check(const gale::PyValue& v, int depth) {
  if (depth > 10000) return;
  if (v.kind == gale::PyValue::kTensor && v.data.defined() && v.data.numel() != gale::shape_numel(v.shape)) std::abort();
  for (const auto& x : v.items)
    if (x && x.get() != &v) check(*x, depth + 1);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string bytes(reinterpret_cast<const char*>(data), size);
  auto t = gale::read_torch_bytes(bytes, "fuzz.pt");
  if (t.ok()) check(**t, 0);
  auto p = gale::parse_pickle(std::string_view(bytes), "fuzz.pkl");
  (void)p;
  auto d = gale::DcpCheckpoint::from_metadata(std::string_view(bytes), "fuzz");  // a .metadata index
  if (d.ok())
    for (const auto& [key, info] : d->tensors()) {  // chunks lie inside their tensor and cover it
      int64_t covered = 0;
      for (const auto& c : info.chunks) {
        if (c.offsets.size() != info.shape.size() || c.sizes.size() != info.shape.size()) std::abort();
        for (size_t k = 0; k < c.sizes.size(); ++k)
          if (c.offsets[k] < 0 || c.offsets[k] + c.sizes[k] > info.shape[k]) std::abort();
        covered += gale::shape_numel(c.sizes);
      }
      if (covered != gale::shape_numel(info.shape)) std::abort();
    }
  return 0;
}
