// MindSpeed's quantisation-aware training flags (QATQuantEngineFeature; features/feature_qat.cc).
#include "train/arguments.h"

namespace gale {

void add_qat_args(ArgParser& p, ModelArgs& a) {
  p.group("quantisation-aware training");
  p.add_choice("--qat-scheme", &a.qat_scheme,
               {"w4a16-mxfp4", "w4a16-mxfp4-moe-only", "w8a16-mxfp8", "w8a16-mxfp8-moe-only"},
               "MX fake-quantised linear weights in training (MindSpeed's QAT; model/qat.h): MXFP4 (E2M1) or MXFP8 "
               "(E4M3) elements with an E8M0 scale per block along the input dimension, activations unquantised; "
               "-moe-only: the routed experts' weights only");
  p.add("--qat-quant-block-size", &a.qat_quant_block_size,
        "--qat-scheme: elements per MX block (32 or 128; must divide every quantised weight's input dimension on "
        "each tensor-parallel rank)");
}

}  // namespace gale
