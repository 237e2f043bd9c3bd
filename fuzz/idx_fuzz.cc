// libFuzzer target: the .idx parser (and the .npy parser of the index cache) on arbitrary bytes.
// Whatever parses must be internally consistent: every sequence lies inside the .bin size and
// the document indices are in order.
#include <cstdint>
#include <cstdlib>

#include "data/indexed_dataset.h"
#include "data/npy.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto v = gale::IndexView::parse(data, static_cast<int64_t>(size), "fuzz.idx");
  if (v.ok()) {
    int64_t item = gale::token_dtype_size(v->dtype), end = 0;
    for (int64_t i = 0; i < v->sequence_count; ++i) {
      int64_t p = v->sequence_pointers[i], len = v->sequence_lengths[i];
      if (len < 0 || p != end) std::abort();
      end = p + len * item;
    }
    if (end != v->bin_bytes) std::abort();
    for (int64_t k = 1; k < v->document_count; ++k)
      if (v->document_indices[k] < v->document_indices[k - 1] || v->document_indices[k] > v->sequence_count)
        std::abort();
  }
  auto n = gale::parse_npy<int64_t>(data, static_cast<int64_t>(size), "fuzz.npy");
  if (n.ok()) {
    int64_t count = 1;
    for (int64_t d : n->shape) count *= d;
    if (count != static_cast<int64_t>(n->data.size())) std::abort();
  }
  return 0;
}
