// The Mamba-2 mixer tests' model: a one-mixer config and its parameters registered and initialised.
#pragma once

#include <cstdint>

#include "model/config.h"
#include "model/mamba_mixer.h"
#include "model/params.h"

namespace gale::testing {

// `layers` Mamba layers ("M"·layers) of hidden H: heads of P channels in G groups, d_state N, d_conv K, RMSNorm.
inline ModelConfig mamba_mixer_config(int64_t layers, int64_t H, int64_t P, int64_t G, int64_t N, int64_t K) {
  ModelConfig c;
  c.num_layers = layers;
  c.hidden = H;
  c.rms_norm = true;
  c.hybrid.enabled = true;
  c.hybrid.layers = std::string(static_cast<size_t>(layers), 'M');
  c.hybrid.headdim = P;
  c.hybrid.ngroups = G;
  c.hybrid.d_state = N;
  c.hybrid.d_conv = K;
  return c;
}

// Layer 0's mixer parameters of `config`, initialised from seed 11.
struct MambaTestMixer {
  ModelConfig c;
  MambaDims d;
  ParamBuffer pb;
  MambaParamIds w;
  explicit MambaTestMixer(const ModelConfig& config) : c(config), d(MambaDims::of(config)) {
    w = register_mamba_params(pb, c, 0);
    pb.finalize();
    pb.initialize(11);
  }
};

}  // namespace gale::testing
