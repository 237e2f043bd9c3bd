// Multi-token prediction in model tests: the training objective with the MTP losses, the finite-difference check of every parameter against it, and an independent cross-entropy.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "model/gpt_model.h"
#include "testing.h"

namespace gale::testing {

// One training forward and backward: the objective main mean loss + factor/D·Σ_k L_k, its
// gradients in the model (zeroed first when `backward`), and the MTP losses L_k in *mtp.
inline double mtp_objective(GPTModel& model, const MicroBatch& mb, bool backward, std::vector<double>* mtp = nullptr) {
  GPTModel::LossSums sums;
  model.take_mtp_losses();
  model.forward(0, mb, Tensor(), /*training=*/true, &sums);
  const std::vector<double> l = model.take_mtp_losses();
  if (backward) model.params().zero_grads();
  model.backward(0, Tensor(), static_cast<float>(1.0 / sums.tokens));
  double j = sums.loss_sum / sums.tokens;
  const ModelConfig& c = model.config();
  for (double v : l) j += c.mtp_loss_scaling_factor / static_cast<double>(c.mtp_num_layers) * v;
  if (mtp) *mtp = l;
  return j;
}

// mtp_objective's gradient of every parameter against a 5-point directional finite difference
// with step `step` in a random direction per parameter (relative tolerance 1e-2, as
// tests/model/gpt_model_test.cc). The MTP losses of the first evaluation go to *mtp; returns the
// names of the parameters checked. The objective's later evaluations add to the gradient buffer;
// only the copy taken first is read.
inline std::vector<std::string> expect_mtp_gradients_match(GPTModel& model, const MicroBatch& mb, double step,
                                                           std::vector<double>* mtp) {
  mtp_objective(model, mb, true, mtp);
  ParamBuffer& pb = model.params();
  const std::vector<float> grads(pb.flat_grads().data<float>(), pb.flat_grads().data<float>() + pb.numel());
  auto loss = [&] { return mtp_objective(model, mb, false); };
  std::vector<std::string> names;
  for (int id = 0; id < pb.size(); ++id) {
    const int64_t n = pb.spec(id).local_numel();
    const auto dir = random_vector(n, 100 + id);
    const double analytic = dot(grads.data() + pb.spec(id).offset, dir.data(), n);
    const double numeric = directional_derivative_5point(loss, pb.param_data(id), dir.data(), n, step);
    EXPECT_LT(rel_diff(analytic, numeric, 1e-2), 1e-2) << pb.spec(id).name << ": " << analytic << " vs " << numeric;
    names.push_back(pb.spec(id).name);
  }
  return names;
}

// An independent cross-entropy for the MTP loss checks: Σ mask·(−log softmax(out_w · h)[label])
// over [S, B] hidden rows `h` (token t = s·B + b, [T, H]) against [B, S] sample-major `labels` and
// `mask`, in double; the mask's sum in *tokens.
inline double masked_cross_entropy_sum(const float* out_w, const std::vector<double>& h,
                                       const std::vector<int32_t>& labels, const std::vector<float>& mask, int64_t B,
                                       int64_t S, int64_t V, int64_t H, double* tokens) {
  double loss = 0.0;
  *tokens = 0.0;
  for (int64_t s = 0; s < S; ++s)
    for (int64_t b = 0; b < B; ++b) {
      const int64_t t = s * B + b, i = b * S + s;
      std::vector<double> logits(static_cast<size_t>(V));
      double mx = -1e300;
      for (int64_t v = 0; v < V; ++v) {
        double acc = 0.0;
        for (int64_t j = 0; j < H; ++j) acc += out_w[v * H + j] * h[t * H + j];
        logits[v] = acc;
        mx = std::max(mx, acc);
      }
      double se = 0.0;
      for (double l : logits) se += std::exp(l - mx);
      loss += mask[i] * (mx + std::log(se) - logits[labels[i]]);
      *tokens += mask[i];
    }
  return loss;
}

// How many of `names` start with `prefix` and contain `part` (empty: any).
inline int count_names(const std::vector<std::string>& names, const std::string& prefix, const std::string& part = "") {
  int n = 0;
  for (const std::string& name : names)
    n += name.rfind(prefix, 0) == 0 && (part.empty() || name.find(part) != std::string::npos);
  return n;
}

}  // namespace gale::testing
