// The distillation loss of QAD (MindSpeed's --qad-enable, features/feature_qad.cc): the KL
// divergence of a frozen teacher's output distribution from the student's, per token, and its
// gradient with respect to the student's logits.
//
// For token t with student logits s[t, ·] and teacher logits z[t, ·] over the V vocabulary entries
// and temperature τ (--kl-temperature), with p = softmax(z / τ) (teacher) and q = softmax(s / τ)
// (student):
//   kl_t = τ² · Σ_v p_v · (log p_v − log q_v)          (forward KL(teacher ‖ student), τ² as Hinton)
//   d kl_t / d s[t, v] = τ · (q_v − p_v)
// A micro-batch's KL term with loss mask m (MindSpeed's _apply_loss_mask):
//   mean: Σ_t m_t·kl_t / Σ_t m_t  (0 when no token counts)       sum: Σ_t m_t·kl_t
// Computed in f64 per token from f32 logits (log-sum-exp with the row maximum subtracted).
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace gale {

enum class KlReduction { kMean, kSum };  // --kl-loss-reduction mean | sum

// kl_t of each of the T rows of student and teacher logits [T, V] (row-major), into kl[T].
void logits_kl_per_token(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                         double* kl);

// d[t, v] = coef[t] · τ · (q_v − p_v): the gradient of Σ_t coef[t]·kl_t with respect to the
// student's logits [T, V] (written).
void logits_kl_backward(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                        const float* coef, float* d);

// Sums (or maxima) of `n` doubles over the ranks that hold the vocabulary's slices, in place.
using KlAllReduce = std::function<void(double* data, int64_t n, bool max)>;

// Both in one pass (what the model runs: two exponentials per logit instead of seven): kl[t] and,
// where coef[t] != 0, d[t, ·] as logits_kl_backward (rows with coef[t] == 0 are zeroed). The
// teacher's row of token t is teacher_rows[t] (null: t), at teacher + row·teacher_ld (0: V), so
// sample-major teacher logits need no reordering copy.
// Vocabulary-parallel (all_reduce set, Megatron's vocab-parallel cross-entropy's way): this rank
// holds V columns of each row, student [T, V] and the teacher's matching columns; the row maxima
// and exponential sums are reduced over the ranks first, kl[t] is the reduced (whole-vocabulary)
// value on every rank, d this rank's columns (four exponentials per logit).
void logits_kl_forward_backward(const float* student, const float* teacher, int64_t T, int64_t V, double temperature,
                                const float* coef, double* kl, float* d, const int64_t* teacher_rows = nullptr,
                                int64_t teacher_ld = 0, const KlAllReduce& all_reduce = nullptr);

// The micro-batch's KL term from the per-token values and the loss mask (header comment).
double reduce_kl(const std::vector<double>& kl, const std::vector<float>& mask, KlReduction reduction);

}  // namespace gale
