// libFuzzer target: torch.save files (zip archive + protocol-2 pickle + storages) and bare pickles on arbitrary bytes.
// Whatever parses must be consistent: every tensor's data has its shape's element count.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

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
  return 0;
}
