// The hidden states and document ids a stage sends under --use-multiparameter-pipeline-model-parallel.
#include "schedule/stage_tensors.h"

#include <cstring>

#include "core/check.h"

namespace gale {

PipeTensorSpecs StageTensors::specs(const Shape& hidden, const MicroBatch& mb) const {
  PipeTensorSpecs s = {hidden_states_spec(hidden)};
  if (document_ids) s.push_back(PipeTensorSpec{"document_ids", {mb.B, mb.S}, DType::kI32, /*requires_grad=*/false});
  return s;
}

std::vector<Tensor> StageTensors::outputs(Tensor hidden, const MicroBatch& mb) const {
  std::vector<Tensor> out;
  out.push_back(std::move(hidden));
  if (document_ids) {
    GALE_CHECK_EQ(static_cast<int64_t>(mb.document_ids.size()), mb.B * mb.S)
        << "the stage has no document ids to pass on";
    Tensor ids = Tensor::empty({mb.B, mb.S}, DType::kI32);
    std::memcpy(ids.raw(), mb.document_ids.data(), ids.nbytes());
    out.push_back(std::move(ids));
  }
  return out;
}

Tensor StageTensors::take_inputs(std::vector<Tensor> received, MicroBatch* mb) const {
  GALE_CHECK_EQ(received.size(), static_cast<size_t>(document_ids ? 2 : 1));
  if (document_ids) {
    const Tensor& ids = received[1];
    GALE_CHECK(ids.dtype() == DType::kI32 && ids.numel() == mb->B * mb->S);
    mb->document_ids.resize(static_cast<size_t>(ids.numel()));
    std::memcpy(mb->document_ids.data(), ids.raw(), ids.nbytes());
  }
  return std::move(received[0]);
}

}  // namespace gale
