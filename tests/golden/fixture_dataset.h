// The inputs of a golden fixture as a training dataset, for tests that run the real trainer on them.
#pragma once

#include <cstdint>
#include <vector>

#include "data/sample.h"
#include "golden/golden_fixture.h"

namespace gale::golden {

// The fixture's inputs as a dataset: sample k is row k % mbs of micro-batch (k % gbs) / mbs of
// iteration k / gbs, so the trainer's Megatron sampler reads exactly the reference's batches.
class FixtureDataset : public SampleDataset {
 public:
  explicit FixtureDataset(const GoldenFixture& f) : f_(f) {}
  int64_t size() const override {
    return static_cast<int64_t>(f_.num_iterations()) * f_.training().global_batch_size;
  }
  Status get(int64_t index, TrainingSample* out) const override {
    const int gbs = f_.training().global_batch_size, mbs = f_.training().micro_batch_size;
    golden::GoldenBatch b = f_.batch(static_cast<int>(index / gbs), static_cast<int>(index % gbs / mbs));
    const int64_t row = index % mbs, S = b.tokens.size(1);
    auto ints = [&](const Tensor& t, std::vector<int32_t>* v) {
      v->resize(S);
      for (int64_t s = 0; s < S; ++s) (*v)[s] = static_cast<int32_t>(t.data<int64_t>()[row * S + s]);
    };
    ints(b.tokens, &out->tokens);
    ints(b.labels, &out->labels);
    ints(b.position_ids, &out->position_ids);
    out->loss_mask.assign(b.loss_mask.data<float>() + row * S, b.loss_mask.data<float>() + (row + 1) * S);
    if (b.document_ids.defined())
      ints(b.document_ids, &out->document_ids);
    else
      out->document_ids.assign(S, 0);
    return Status::Ok();
  }

 private:
  const GoldenFixture& f_;
};

}  // namespace gale::golden
