// Clipping and AdamW / SGD / Muon / Lion updates over the owned pieces of flat buffers.
#include "optim/optimizer.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <numeric>

#include "kernels/cpu/fp8_codec.h"
#include "optim/quant_grads.h"

namespace gale {

namespace {

// The pieces of `pb`'s parameters inside `ranges`, with state packed in range order and, inside a
// range, in flat order. Elements of no parameter (--param-and-grad-buffer-pad's zeros,
// ParamBuffer::insert_padding) get no state: without them the state is the ranges' elements.
std::vector<Optimizer::Segment> segments_of(const ParamBuffer& pb, const std::vector<FlatRange>& ranges) {
  std::vector<Optimizer::Segment> out;
  int64_t state = 0;
  for (const FlatRange& r : ranges) {
    GALE_CHECK(r.begin >= 0 && r.end <= pb.trainable_numel())
        << "owned range [" << r.begin << ", " << r.end << ") outside the trainable buffer of " << pb.trainable_numel();
    const size_t first = out.size();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      const int64_t lo = std::max(r.begin, s.offset), hi = std::min(r.end, s.offset + s.local_numel());
      if (hi <= lo) continue;
      out.push_back(Optimizer::Segment{id, lo, hi - lo, 0});
    }
    // State offset: the elements of this range's pieces below it (its position in the range when
    // the pieces tile the range).
    std::vector<size_t> by_offset;
    for (size_t i = first; i < out.size(); ++i) by_offset.push_back(i);
    std::sort(by_offset.begin(), by_offset.end(), [&](size_t a, size_t b) { return out[a].begin < out[b].begin; });
    for (size_t i : by_offset) {
      out[i].state_offset = state;
      state += out[i].numel;
    }
  }
  return out;
}

}  // namespace

Optimizer::Optimizer(const OptimizerConfig& config, std::vector<OptimizedBuffer> buffers, const OpTable* ops,
                     Comm norm_group, Comm shard_group, ExpertNormGroups expert_groups, Comm tp_group)
    : config_(config),
      ops_(ops),
      norm_group_(std::move(norm_group)),
      shard_group_(std::move(shard_group)),
      expert_groups_(std::move(expert_groups)),
      tp_group_(std::move(tp_group)) {
  GALE_CHECK(config_.type == "adam" || config_.type == "sgd" || config_.type == "muon" || config_.type == "lion")
      << "optimizer " << config_.type;
  const bool muon = config_.type == "muon";
  // Muon or Lion: Megatron's emerging optimizers, for the parameters OptimizedBuffer::muon marks.
  const bool emerging = muon || config_.type == "lion";
  GALE_CHECK(config_.muon.scalar_optimizer == "adam" || config_.muon.scalar_optimizer == "lion")
      << "--muon-scalar-optimizer " << config_.muon.scalar_optimizer;
  if (muon) {
    const MuonConfig& m = config_.muon;
    std::optional<NsCoefficients> c = ns_coefficients(m.coefficient_type);
    GALE_CHECK(c.has_value()) << "--muon-coefficient-type " << m.coefficient_type;
    ns_coefficients_ = *c;
    GALE_CHECK(m.num_ns_steps >= 1) << "--muon-num-ns-steps " << m.num_ns_steps;
    GALE_CHECK(muon_scale_factor(1, 1, m.scale_mode).has_value()) << "--muon-scale-mode " << m.scale_mode;
    GALE_CHECK(m.tp_mode == "duplicated" || m.tp_mode == "distributed" || m.tp_mode == "blockwise")
        << "--muon-tp-mode " << m.tp_mode;
    GALE_CHECK(m.fp32_matmul_prec == "medium" || m.fp32_matmul_prec == "high")
        << "--muon-fp32-matmul-prec " << m.fp32_matmul_prec;
  }
  GALE_CHECK(!config_.swap || !emerging) << "--swap-optimizer with --optimizer " << config_.type << ": not supported";
  GALE_CHECK(!config_.compress || !emerging) << "--compress-optimizer with --optimizer " << config_.type
                                             << ": not supported";
  GALE_CHECK(!config_.compress || !config_.swap) << "--compress-optimizer with --swap-optimizer: not supported";
  GALE_CHECK(!config_.compress || config_.quant_states.empty()) << "--compress-optimizer with --quant-states: not supported";
  GALE_CHECK(!config_.compress || !config_.ema)
      << "--compress-optimizer with --optimizer-selection fused_ema_adamw: not supported";
  GALE_CHECK(!config_.compress || config_.compress_chunk >= 1) << "--compress-optimizer chunk " << config_.compress_chunk;
  quant_ = !config_.quant_states.empty();
  if (quant_) {
    GALE_CHECK(config_.quant_states == "fp8" || config_.quant_states == "mxfp8" || config_.quant_states == "hif8")
        << "--quant-states " << config_.quant_states << ": expected fp8, hif8 or mxfp8";
    GALE_CHECK(config_.type == "adam") << "--quant-states quantises Adam's moments; --optimizer is " << config_.type;
    GALE_CHECK(!config_.swap) << "--quant-states with --swap-optimizer: not supported";
    quant_mode_ = config_.quant_states == "fp8"    ? QuantMode::kLinear
                  : config_.quant_states == "hif8" ? QuantMode::kHiF8
                                                   : QuantMode::kMx;
  }
  GALE_CHECK(parse_state_dtype(config_.exp_avg_dtype, &m_dtype_) && parse_state_dtype(config_.exp_avg_sq_dtype, &v_dtype_))
      << "--exp-avg-dtype " << config_.exp_avg_dtype << ", --exp-avg-sq-dtype " << config_.exp_avg_sq_dtype
      << ": expected fp32, fp16 or fp8";
  scaled_ = m_dtype_ != StateDType::kF32 || v_dtype_ != StateDType::kF32;
  if (scaled_) {
    GALE_CHECK(config_.type == "adam") << "--use-precision-aware-optimizer needs --optimizer adam, found " << config_.type;
    GALE_CHECK(!quant_ && !config_.swap && !config_.compress && !config_.ema)
        << "--use-precision-aware-optimizer with --quant-states, --swap-optimizer, --compress-optimizer or "
           "fused_ema_adamw: not supported";
  }
  GALE_CHECK(!config_.ema || config_.type == "adam")
      << "--optimizer-selection fused_ema_adamw needs --optimizer adam, found " << config_.type;
  GALE_CHECK(!config_.ema || !config_.swap) << "--optimizer-selection fused_ema_adamw with --swap-optimizer: not supported";
  GALE_CHECK(!config_.ema || (config_.ema_decay >= 0.0 && config_.ema_decay <= 1.0))
      << "--ema-decay " << config_.ema_decay << ": expected a value in [0, 1]";
  GALE_CHECK(!(quant_ && config_.ema)) << "--quant-states with --optimizer-selection fused_ema_adamw: not supported";
  int64_t state_base = 0;
  for (OptimizedBuffer& b : buffers) {
    GALE_CHECK(b.params->finalized());
    GALE_CHECK(!config_.swap || !b.params->reuses_fp32()) << "--swap-optimizer with --reuse-fp32-param: not supported";
    GALE_CHECK(!config_.compress || !b.params->reuses_fp32())
        << "--compress-optimizer with --reuse-fp32-param: not supported";
    GALE_CHECK(!config_.ema || !b.params->reuses_fp32())
        << "--optimizer-selection fused_ema_adamw with --reuse-fp32-param: not supported";
    if (b.counts_in_norm.empty()) b.counts_in_norm.assign(static_cast<size_t>(b.params->size()), true);
    GALE_CHECK_EQ(static_cast<int>(b.counts_in_norm.size()), b.params->size());
    const size_t np = static_cast<size_t>(b.params->size());
    if (b.muon.empty()) b.muon.assign(np, false);
    if (b.qkv_split.empty()) b.qkv_split.assign(np, {});
    if (b.expert_tp.empty()) b.expert_tp.assign(np, false);
    if (b.weight_decay.empty())
      for (size_t id = 0; id < np; ++id) b.weight_decay.push_back(b.params->spec(static_cast<int>(id)).weight_decay);
    GALE_CHECK_EQ(b.weight_decay.size(), np);
    GALE_CHECK_EQ(b.muon.size(), np);
    GALE_CHECK_EQ(b.qkv_split.size(), np);
    GALE_CHECK_EQ(b.expert_tp.size(), np);
    GALE_CHECK(b.layer_wise_owner.empty() || (b.layer_wise_owner.size() == np && b.owned.has_value()))
        << "layer-wise owners: one per parameter, with the owned ranges";
    if (emerging) {
      GALE_CHECK(!b.owned.has_value() || !b.layer_wise_owner.empty())
          << "--optimizer " << config_.type << " with the element-wise distributed optimizer: it runs layer-wise";
      for (size_t id = 0; id < np; ++id)
        if (b.muon[id]) GALE_CHECK_EQ(b.params->spec(static_cast<int>(id)).global_shape.size(), 2u);
    } else {
      b.muon.assign(np, false);
    }
    BufferState s;
    s.sharded = b.owned.has_value();
    // Frozen parameters (LoRA's base) sit after trainable_numel(): no segment, no state.
    const std::vector<FlatRange> ranges =
        s.sharded ? *b.owned : std::vector<FlatRange>{{0, b.params->trainable_numel()}};
    s.segments = segments_of(*b.params, ranges);
    int64_t n = 0;
    for (const Segment& seg : s.segments) n += seg.numel;
    s.buffer = std::move(b);
    s.state_numel = n;
    s.state_base = state_base;
    state_base += n;
    if (config_.frozen) {
      // --freeze-all-layers: never steps, so no state at all
    } else if (config_.swap || config_.compress) {
      // no resident state: open_swap() creates the file; --compress-optimizer's blocks below
    } else if (quant_) {
      // Blocks counted from the start of each parameter: fp8 and hif8 gcd(numel, 128) elements (the
      // whole parameter when that is below 16), mxfp8 32; a segment starting inside a block begins
      // with the rest of that block.
      int64_t scale_bytes = 0;
      for (const Segment& seg : s.segments) {
        const ParamSpec& spec = s.buffer.params->spec(seg.param_id);
        const int64_t local = spec.local_numel(), start = seg.begin - spec.offset;
        int64_t block = 32;
        if (quant_mode_ != QuantMode::kMx) {
          const int64_t g = std::gcd(local, int64_t{128});
          block = g >= 16 ? g : local;
        }
        const QuantLayout layout{quant_mode_, block, block - start % block};
        s.quant.push_back(BufferState::QuantSegment{layout, scale_bytes});
        scale_bytes += quant_num_blocks(seg.numel, layout) * quant_scale_bytes(quant_mode_);
      }
      s.m_codes = Tensor::zeros({n}, DType::kU8);
      s.v_codes = Tensor::zeros({n}, DType::kU8);
      s.m_scales = Tensor::zeros({scale_bytes}, DType::kU8);
      s.v_scales = Tensor::zeros({scale_bytes}, DType::kU8);
      if (quant_mode_ == QuantMode::kLinear) {  // scale 1 (codes 0: the zero state)
        const float one = 1.0f;
        for (Tensor* t : {&s.m_scales, &s.v_scales})
          for (int64_t at = 0; at < scale_bytes; at += 4) std::memcpy(t->data<uint8_t>() + at, &one, sizeof one);
      } else if (quant_mode_ == QuantMode::kHiF8) {  // codes 0 with an all-zero block's scale, 1 / T
        for (const auto& [t, target] : {std::pair{&s.m_scales, kHiF8TargetExpAvg}, std::pair{&s.v_scales, kHiF8TargetExpAvgSq}}) {
          const float zero_scale = fp8::hif8_scale(0.0f, target);
          for (int64_t at = 0; at < scale_bytes; at += 4)
            std::memcpy(t->data<uint8_t>() + at, &zero_scale, sizeof zero_scale);
        }
      }
    } else if (scaled_) {  // an f32 moment as usual; an fp16 or fp8 one as codes and a scale per segment
      const int64_t segments = static_cast<int64_t>(s.segments.size());
      auto allocate = [&](StateDType d, Tensor* f32, Tensor* codes, Tensor* scales) {
        if (d == StateDType::kF32) {
          *f32 = Tensor::zeros({n});
          return;
        }
        *codes = Tensor::zeros({n}, d == StateDType::kF16 ? DType::kF16 : DType::kU8);
        *scales = Tensor::zeros({segments});  // TE's initial scale, 1; the codes are zero
        std::fill(scales->data<float>(), scales->data<float>() + segments, 1.0f);
      };
      allocate(m_dtype_, &s.exp_avg, &s.m_codes, &s.m_scales);
      allocate(v_dtype_, &s.exp_avg_sq, &s.v_codes, &s.v_scales);
    } else if (config_.type == "adam" || emerging) {  // Muon and Lion: their momentum in exp_avg (Optimizer::state)
      s.exp_avg = Tensor::zeros({n});
      if (!muon_lion_only()) s.exp_avg_sq = Tensor::zeros({n});
      if (config_.ema) s.ema = Tensor::zeros({n});  // set to the parameters at the first step
    } else if (config_.sgd_momentum != 0.0) {
      s.momentum = Tensor::zeros({n});
    }
    buffers_.push_back(std::move(s));
  }
  if (config_.compress && !config_.frozen) {
    std::vector<StateRun> runs;
    for (const BufferState& b : buffers_)
      for (const Segment& seg : b.segments) runs.push_back(StateRun{b.state_base + seg.state_offset, seg.numel});
    const int64_t times = (state_base + config_.compress_chunk - 1) / config_.compress_chunk;
    swap_ = OptimizerStateSwap::create_compressed(static_cast<int>(state_names().size()), state_base,
                                                  plan_swap_chunks(runs, state_base, times));
  }
}

Optimizer::Optimizer(const OptimizerConfig& config, ParamBuffer* params, const OpTable* ops, Comm norm_group)
    : Optimizer(config, std::vector<OptimizedBuffer>{OptimizedBuffer{params, {}, std::nullopt}}, ops,
                std::move(norm_group)) {}

float ema_decay_at(double ema_decay, int64_t step) {
  const double t = static_cast<double>(step);
  return static_cast<float>(std::min(ema_decay, (1.0 + t) / (10.0 + t)));
}

bool Optimizer::muon_lion_only() const { return config_.type == "muon" && config_.muon.scalar_optimizer == "lion"; }

std::vector<std::string> Optimizer::state_names() const {
  if (config_.ema) return {"exp_avg", "exp_avg_sq", "ema_params"};
  if (muon_lion_only()) return {"exp_avg"};
  if (config_.type == "adam" || config_.type == "muon" || config_.type == "lion") return {"exp_avg", "exp_avg_sq"};
  if (config_.sgd_momentum != 0.0) return {"momentum_buffer"};
  return {};
}

Status Optimizer::open_swap() {
  GALE_CHECK(config_.swap && !swap_) << "open_swap: needs --swap-optimizer, once";
  if (config_.frozen) return Status::Ok();  // no state to swap
  std::vector<StateRun> runs;
  int64_t total = 0;
  for (const BufferState& b : buffers_) {
    for (const Segment& seg : b.segments) runs.push_back(StateRun{b.state_base + seg.state_offset, seg.numel});
    total += b.state_numel;
  }
  const char* tmp = std::getenv("TMPDIR");
  const std::string dir = !config_.swap_dir.empty() ? config_.swap_dir : tmp && *tmp ? std::string(tmp) : "/tmp";
  GALE_ASSIGN_OR_RETURN(swap_, OptimizerStateSwap::create(dir, static_cast<int>(state_names().size()), total,
                                                          plan_swap_chunks(runs, total, config_.swap_times)));
  return Status::Ok();
}

float* Optimizer::state_at(BufferState& b, int k, int64_t index) {
  if (swap_) return swap_->at(k, b.state_base + index);
  Tensor& t = k == 2 ? b.ema : k == 1 ? b.exp_avg_sq : b.momentum.defined() ? b.momentum : b.exp_avg;
  return t.data<float>() + index;
}

template <class Fn>
void Optimizer::for_each_swap_piece(const BufferState& b, const Segment& seg, Fn&& fn) {
  if (!swap_) {
    fn(int64_t{0}, seg.numel);
    return;
  }
  const int64_t first = b.state_base + seg.state_offset;
  for (int64_t at = 0; at < seg.numel;) {
    const int c = swap_->chunk_of(first + at);
    swap_->load(c);  // writes back the previous chunk (H2D/D2H of MindSpeed's step, here pread/pwrite)
    const int64_t n = std::min(seg.numel - at, swap_->bounds()[static_cast<size_t>(c) + 1] - (first + at));
    fn(at, n);
    at += n;
  }
}

double Optimizer::sum_over_groups(double dense, double expert) const {
  auto sum = [](const Comm& g, double v) { return g && g->size() > 1 ? g->all_reduce_scalar(v, ReduceOp::kSum) : v; };
  dense = sum(norm_group_, sum(shard_group_, dense));
  if (!expert_groups_.norm_group) return dense + expert;  // no expert parallelism: expert is 0
  return dense + sum(expert_groups_.norm_group, sum(expert_groups_.shard_group, expert));
}

float* Optimizer::grad_of(const BufferState& b, const Segment& seg) const {
  if (b.buffer.quant_grads) return b.buffer.quant_grads->main_grad(seg.param_id, seg.begin, seg.numel);
  return b.buffer.params->master_grad(seg.begin);
}

double Optimizer::norm_of(bool grads) const {
  double sq = 0.0, expert_sq = 0.0;
  for (const BufferState& b : buffers_) {
    const ParamBuffer& pb = *b.buffer.params;
    for (const Segment& seg : b.segments) {
      if (!b.buffer.counts_in_norm[static_cast<size_t>(seg.param_id)]) continue;
      double& acc = pb.spec(seg.param_id).expert_parallel ? expert_sq : sq;
      if (!grads && pb.is_split(seg.param_id)) {  // --reuse-fp32-param: the reconstructed values
        Tensor values = Tensor::empty({seg.numel});
        pb.read_values(seg.begin, seg.numel, values.data<float>());
        acc += ops_->sum_of_squares(values.data<float>(), seg.numel);
      } else {
        acc += ops_->sum_of_squares(grads ? grad_of(b, seg) : pb.master_data(seg.begin), seg.numel);
      }
    }
  }
  return std::sqrt(sum_over_groups(sq, expert_sq));
}

double Optimizer::grad_norm() const { return norm_of(true); }
double Optimizer::params_norm() const { return norm_of(false); }

StepResult Optimizer::step(double lr, double wd, bool want_zeros, float inv_grad_scale, Timers* timers,
                           std::optional<double> decoupled_lr, std::optional<double> mup_lr) {
  GALE_CHECK(!config_.frozen) << "Optimizer::step with --freeze-all-layers: a frozen run holds no optimizer state";
  StepResult r;
  if (inv_grad_scale != 1.0f) {
    // Megatron's unscale-and-check-inf; the check for non-finite values is the norm's below.
    ScopedTimer timer = ScopedTimer::level1(timers, "optimizer-unscale-and-check-inf");
    for (BufferState& b : buffers_) {
      if (b.buffer.quant_grads) {  // --quant-grads: applied as the store hands the gradients out
        b.buffer.quant_grads->scale(inv_grad_scale);
        continue;
      }
      for (const Segment& seg : b.segments)
        scale_inplace(b.buffer.params->master_grad(seg.begin), seg.numel, inv_grad_scale);
    }
  }
  {
    ScopedTimer timer = ScopedTimer::level1(timers, "optimizer-clip-main-grad");
    r.grad_norm = grad_norm();
  }
  ScopedTimer count_timer = ScopedTimer::level1(timers, "optimizer-count-zeros");
  if (want_zeros) {
    int64_t zeros = 0, expert_zeros = 0;
    for (const BufferState& b : buffers_) {
      const ParamBuffer& pb = *b.buffer.params;
      for (const Segment& seg : b.segments)
        if (b.buffer.counts_in_norm[static_cast<size_t>(seg.param_id)])
          (pb.spec(seg.param_id).expert_parallel ? expert_zeros : zeros) +=
              count_zeros(grad_of(b, seg), seg.numel);
    }
    // Counts below 2^53 add exactly in doubles.
    r.num_zeros = static_cast<int64_t>(sum_over_groups(static_cast<double>(zeros), static_cast<double>(expert_zeros)));
  }
  count_timer.stop();
  if (!std::isfinite(r.grad_norm)) return r;
  GALE_CHECK(!config_.swap || swap_) << "--swap-optimizer: open_swap() before the first step";
  ScopedTimer step_timer = ScopedTimer::level1(timers, "optimizer-inner-step");
  const double coeff = config_.clip_grad > 0.0 ? config_.clip_grad / (r.grad_norm + 1e-6) : 1.0;
  ++step_;
  AdamWHyper h;
  h.beta1 = static_cast<float>(config_.beta1);
  h.beta2 = static_cast<float>(config_.beta2);
  h.eps = static_cast<float>(config_.eps);
  h.step = step_;
  const float ema_decay = config_.ema ? ema_decay_at(config_.ema_decay, step_) : 0.0f;
  // --reuse-fp32-param: a parameter stored split (model/params.h) is reconstructed in f32 blocks of
  // kSplitBlock elements (a multiple of every vector width: each element's update is the same
  // whatever block it falls in), updated, and split again; Muon's whole-matrix update takes it whole.
  constexpr int64_t kSplitBlock = int64_t{1} << 16;
  Tensor block;
  // The precision-aware optimizer: f32 copies of a segment's scaled moments during its update.
  Tensor m32, v32;
  if (scaled_) {
    int64_t largest = 0;
    for (const BufferState& b : buffers_)
      for (const Segment& seg : b.segments) largest = std::max(largest, seg.numel);
    m32 = Tensor::empty({largest});
    v32 = Tensor::empty({largest});
  }
  for (size_t bi = 0; bi < buffers_.size(); ++bi) {
    BufferState& b = buffers_[bi];
    ParamBuffer& pb = *b.buffer.params;
    for (size_t si = 0; si < b.segments.size(); ++si) {
      const Segment& seg = b.segments[si];
      // The flat buffers, or under ZeRO-3 (ParamBuffer::shard_storage) this rank's compact shards.
      float* g = grad_of(b, seg);
      const bool decays = b.buffer.weight_decay[static_cast<size_t>(seg.param_id)];
      const float param_wd = decays ? static_cast<float>(wd) : 0.0f;
      const bool decoupled = decoupled_lr && !b.buffer.decoupled_lr.empty() &&
                             b.buffer.decoupled_lr[static_cast<size_t>(seg.param_id)];
      const size_t pid = static_cast<size_t>(seg.param_id);
      const bool mup_rate = mup_lr && pid < b.buffer.mup_lr.size() && b.buffer.mup_lr[pid];
      const double seg_lr = decoupled ? *decoupled_lr : mup_rate ? *mup_lr : lr;
      const bool mup_eps = pid < b.buffer.mup_eps.size() && b.buffer.mup_eps[pid];
      h.eps = static_cast<float>(mup_eps ? config_.eps * config_.mup_eps_mult : config_.eps);
      const bool lion = is_lion(bi, seg.param_id);
      const bool muon = config_.type == "muon" && b.buffer.muon[static_cast<size_t>(seg.param_id)];
      const bool adam = !muon && !lion && (config_.type == "adam" || config_.type == "muon" || config_.type == "lion");
      if (!adam && coeff < 1.0) scale_inplace(g, seg.numel, static_cast<float>(coeff));
      // Lion's betas: the Adam settings for --optimizer lion's own parameters (Megatron's default
      // kwargs of an emerging optimizer), --lion-beta1/2 as Muon's scalar optimizer.
      const bool lion_as_scalar = config_.type == "muon";
      const double lion_beta1 = lion_as_scalar ? config_.lion.beta1 : config_.beta1;
      const double lion_beta2 = lion_as_scalar ? config_.lion.beta2 : config_.beta2;
      h.lr = static_cast<float>(seg_lr);
      h.weight_decay = param_wd;
      h.grad_scale = coeff < 1.0 ? static_cast<float>(coeff) : 1.0f;  // clipping folded into the update
      // Elements [at, at + n) of the segment, their f32 values in p.
      auto update = [&](float* p, int64_t at, int64_t n) {
        if (muon) {
          muon_step(b, seg, p, g, seg_lr, param_wd);
        } else if (lion) {
          lion_step_ref(p, g + at, state_at(b, 0, seg.state_offset + at), n, seg_lr, lion_beta1, lion_beta2,
                        decays ? wd : 0.0);
        } else if (adam && quant_) {  // whole segments: blocks are not cut
          GALE_CHECK(at == 0 && n == seg.numel) << "--quant-states: a segment updated in pieces";
          adamw_step_quantised(p, g, quant_ref(b, si, false), quant_ref(b, si, true), n, b.quant[si].layout, h);
        } else if (adam && scaled_) {  // whole segments: one scale per segment
          GALE_CHECK(at == 0 && n == seg.numel) << "--use-precision-aware-optimizer: a segment updated in pieces";
          adamw_step_scaled(p, g, scaled_ref(b, si, false), scaled_ref(b, si, true), n, h, m32.data<float>(),
                            v32.data<float>(), ops_->adamw_step);
        } else if (adam && config_.ema) {
          float* s = state_at(b, 2, seg.state_offset + at);
          if (step_ == 1) std::copy(p, p + n, s);  // MindSpeed: the EMA starts as the parameters
          ops_->ema_adamw_step(p, g + at, state_at(b, 0, seg.state_offset + at), state_at(b, 1, seg.state_offset + at),
                               s, n, h, ema_decay);
        } else if (adam) {
          ops_->adamw_step(p, g + at, state_at(b, 0, seg.state_offset + at), state_at(b, 1, seg.state_offset + at), n,
                           h);
        } else {
          sgd_step_ref(p, g + at, config_.sgd_momentum != 0.0 ? state_at(b, 0, seg.state_offset + at) : nullptr, n,
                       static_cast<float>(seg_lr), static_cast<float>(config_.sgd_momentum), param_wd, step_ == 1);
        }
      };
      if (!pb.is_split(seg.param_id)) {
        float* p = pb.master_data(seg.begin);
        for_each_swap_piece(b, seg, [&](int64_t at, int64_t n) { update(p + at, at, n); });
        continue;
      }
      const int64_t piece = muon || quant_ || scaled_ ? seg.numel : std::min(seg.numel, kSplitBlock);
      if (!block.defined() || block.numel() < piece) block = Tensor::empty({piece});
      for (int64_t at = 0; at < seg.numel; at += piece) {
        const int64_t n = std::min(piece, seg.numel - at);
        pb.read_values(seg.begin + at, n, block.data<float>());
        update(block.data<float>(), at, n);
        pb.write_values(seg.begin + at, n, block.data<float>());
      }
    }
    gather_layer_wise(b);
    if (after_buffer_step_) after_buffer_step_(bi);
  }
  if (swap_) swap_->flush();
  r.applied = true;
  return r;
}

QuantStateRef Optimizer::quant_ref(const BufferState& b, size_t s, bool second) const {
  const Segment& seg = b.segments[s];
  const Tensor& codes = second ? b.v_codes : b.m_codes;
  const Tensor& scales = second ? b.v_scales : b.m_scales;
  if (quant_mode_ == QuantMode::kHiF8)  // MindSpeed's "hif8_15" and "hif8_224"
    return QuantStateRef{codes.data<uint8_t>() + seg.state_offset, scales.data<uint8_t>() + b.quant[s].scale_offset,
                         Fp8Format::kHiF8, second ? kHiF8TargetExpAvgSq : kHiF8TargetExpAvg};
  return QuantStateRef{codes.data<uint8_t>() + seg.state_offset,
                       scales.data<uint8_t>() + b.quant[s].scale_offset,
                       second ? Fp8Format::kE5M2 : Fp8Format::kE4M3};
}

ScaledStateRef Optimizer::scaled_ref(const BufferState& b, size_t s, bool second) const {
  const Segment& seg = b.segments[s];
  const StateDType d = second ? v_dtype_ : m_dtype_;
  if (d == StateDType::kF32) {
    const Tensor& t = second ? b.exp_avg_sq : b.exp_avg;
    return ScaledStateRef{t.data<float>() + seg.state_offset, nullptr, d};
  }
  const Tensor& codes = second ? b.v_codes : b.m_codes;
  const Tensor& scales = second ? b.v_scales : b.m_scales;
  return ScaledStateRef{static_cast<uint8_t*>(codes.raw()) + seg.state_offset * state_dtype_bytes(d),
                        scales.data<float>() + static_cast<int64_t>(s), d};
}

std::string Optimizer::state_format() const {
  if (quant_) return config_.quant_states;
  if (scaled_) return str_cat("exp_avg:", state_dtype_name(m_dtype_), ",exp_avg_sq:", state_dtype_name(v_dtype_));
  return "";
}

std::vector<std::pair<std::string, Tensor>> Optimizer::quantised_state(size_t b) const {
  if (scaled_) {
    const BufferState& s = buffers_.at(b);
    std::vector<std::pair<std::string, Tensor>> out;
    if (m_dtype_ != StateDType::kF32) {
      out.emplace_back("exp_avg.codes", s.m_codes);
      out.emplace_back("exp_avg.scales", s.m_scales);
    }
    if (v_dtype_ != StateDType::kF32) {
      out.emplace_back("exp_avg_sq.codes", s.v_codes);
      out.emplace_back("exp_avg_sq.scales", s.v_scales);
    }
    return out;
  }
  if (!quant_) return {};
  const BufferState& s = buffers_.at(b);
  return {{"exp_avg.codes", s.m_codes},
          {"exp_avg_sq.codes", s.v_codes},
          {"exp_avg.scales", s.m_scales},
          {"exp_avg_sq.scales", s.v_scales}};
}

std::vector<std::pair<std::string, Tensor>> Optimizer::state(size_t b) const {
  const BufferState& s = buffers_.at(b);
  if (config_.frozen) return {};  // --freeze-all-layers: no state
  if (scaled_) {  // an f32 moment shared, an fp16 or fp8 one as a dequantised copy
    std::vector<std::pair<std::string, Tensor>> out;
    for (int k = 0; k < 2; ++k) {
      const char* name = k == 0 ? "exp_avg" : "exp_avg_sq";
      if ((k == 0 ? m_dtype_ : v_dtype_) == StateDType::kF32) {
        out.emplace_back(name, k == 0 ? s.exp_avg : s.exp_avg_sq);
        continue;
      }
      Tensor t = Tensor::zeros({s.state_numel});
      for (size_t si = 0; si < s.segments.size(); ++si)
        dequantise_scaled_state(scaled_ref(s, si, k == 1), s.segments[si].numel,
                                t.data<float>() + s.segments[si].state_offset);
      out.emplace_back(name, std::move(t));
    }
    return out;
  }
  if (quant_) {  // dequantised copies
    std::vector<std::pair<std::string, Tensor>> out;
    for (int k = 0; k < 2; ++k) {
      Tensor t = Tensor::zeros({s.state_numel});
      for (size_t si = 0; si < s.segments.size(); ++si)
        dequantise_state(quant_ref(s, si, k == 1), s.segments[si].numel, s.quant[si].layout,
                         t.data<float>() + s.segments[si].state_offset);
      out.emplace_back(k == 0 ? "exp_avg" : "exp_avg_sq", std::move(t));
    }
    return out;
  }
  if (config_.swap || config_.compress) {  // copies, read from the file (decompressed)
    GALE_CHECK(swap_) << "--swap-optimizer: open_swap() before reading the state";
    std::vector<std::pair<std::string, Tensor>> out;
    const std::vector<std::string> names = state_names();
    for (size_t k = 0; k < names.size(); ++k) {
      Tensor t = Tensor::empty({s.state_numel});
      const Status st = swap_->read(static_cast<int>(k), s.state_base, s.state_numel, t.data<float>());
      GALE_CHECK(st.ok()) << "--swap-optimizer: " << st.message();
      out.emplace_back(names[k], std::move(t));
    }
    return out;
  }
  if (config_.ema) return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}, {"ema_params", s.ema}};
  if (config_.type == "adam") return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}};
  if (muon_lion_only()) return {{"exp_avg", s.exp_avg}, {"momentum_buffer", s.exp_avg}};
  if (config_.type == "muon")
    return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}, {"momentum_buffer", s.exp_avg}};
  if (config_.type == "lion") return {{"exp_avg", s.exp_avg}, {"exp_avg_sq", s.exp_avg_sq}};
  if (s.momentum.defined()) return {{"momentum_buffer", s.momentum}};
  return {};
}

bool Optimizer::is_muon(size_t b, int param_id) const {
  return buffers_.at(b).buffer.muon.at(static_cast<size_t>(param_id));
}

bool Optimizer::is_lion(size_t b, int param_id) const {
  if (config_.type == "lion") return is_muon(b, param_id);
  return config_.type == "muon" && config_.muon.scalar_optimizer == "lion" && !is_muon(b, param_id);
}

bool Optimizer::holds_state(size_t b, int param_id, const std::string& name) const {
  if (is_lion(b, param_id)) return name == "exp_avg";
  if (config_.type == "lion") return true;  // an AdamW parameter of --optimizer lion
  if (config_.type != "muon") return true;
  return is_muon(b, param_id) == (name == "momentum_buffer");
}

Status Optimizer::store_state(size_t b, const std::vector<std::pair<std::string, Tensor>>& tensors) {
  if (scaled_) {  // an fp16 or fp8 moment quantised again (an f32 one is the optimizer's own tensor)
    const BufferState& s = buffers_.at(b);
    for (const auto& [name, t] : tensors) {
      GALE_CHECK((name == "exp_avg" || name == "exp_avg_sq") && t.numel() == s.state_numel) << "optimizer state " << name;
      const bool second = name == "exp_avg_sq";
      if ((second ? v_dtype_ : m_dtype_) == StateDType::kF32) continue;
      for (size_t si = 0; si < s.segments.size(); ++si) {
        const Segment& seg = s.segments[si];
        std::vector<float> copy(t.data<float>() + seg.state_offset, t.data<float>() + seg.state_offset + seg.numel);
        quantise_scaled_state(copy.data(), seg.numel, scaled_ref(s, si, second));
      }
    }
    return Status::Ok();
  }
  if (quant_) {  // quantised again
    const BufferState& s = buffers_.at(b);
    for (const auto& [name, t] : tensors) {
      GALE_CHECK((name == "exp_avg" || name == "exp_avg_sq") && t.numel() == s.state_numel) << "optimizer state " << name;
      for (size_t si = 0; si < s.segments.size(); ++si)
        quantise_state(t.data<float>() + s.segments[si].state_offset, s.segments[si].numel, s.quant[si].layout,
                       quant_ref(s, si, name == "exp_avg_sq"));
    }
    return Status::Ok();
  }
  if (!swap_) return Status::Ok();
  const BufferState& s = buffers_.at(b);
  const std::vector<std::string> names = state_names();
  for (const auto& [name, t] : tensors) {
    const auto it = std::find(names.begin(), names.end(), name);
    GALE_CHECK(it != names.end() && t.numel() == s.state_numel) << "optimizer state " << name;
    GALE_RETURN_IF_ERROR(swap_->write(static_cast<int>(it - names.begin()), s.state_base, s.state_numel, t.data<float>()));
  }
  return Status::Ok();
}

int64_t Optimizer::state_bytes() const {
  int64_t bytes = swap_ ? swap_->resident_bytes() : 0;
  for (const BufferState& s : buffers_)
    for (const Tensor* t :
         {&s.exp_avg, &s.exp_avg_sq, &s.momentum, &s.m_codes, &s.v_codes, &s.m_scales, &s.v_scales, &s.ema})
      if (t->defined()) bytes += static_cast<int64_t>(t->nbytes());
  return bytes;
}

namespace {

// torch.lerp(start, end, weight) for a scalar weight, as ATen computes it on the CPU.
inline float lerp(float start, float end, float weight) {
  return std::abs(weight) < 0.5f ? std::fma(weight, end - start, start)
                                 : std::fma(-(1.0f - weight), end - start, end);
}

// Rows [first, first + count) of every group of `per` rows of m [groups·per, cols] (the query, key
// or value block of each query group), stacked: [groups·count, cols]. back: the reverse copy.
void group_rows(float* m, int64_t groups, int64_t per, int64_t first, int64_t count, int64_t cols, float* block,
                bool back) {
  for (int64_t gi = 0; gi < groups; ++gi)
    for (int64_t r = 0; r < count; ++r) {
      float* row = m + (gi * per + first + r) * cols;
      float* brow = block + (gi * count + r) * cols;
      if (back)
        std::copy(brow, brow + cols, row);
      else
        std::copy(row, row + cols, brow);
    }
}

}  // namespace

void Optimizer::muon_update(const ParamSpec& spec, const std::vector<int64_t>& qkv_split, bool expert_tp,
                            const float* u, float* out) const {
  const MuonConfig& mc = config_.muon;
  const bool bf16 = mc.fp32_matmul_prec == "medium";
  const bool split = spec.split_dim >= 0 && spec.split_parts > 1;
  const Comm& group = expert_tp ? expert_groups_.tp_group : tp_group_;
  if (split && mc.tp_mode != "blockwise") {
    GALE_CHECK(group && group->size() == spec.split_parts)
        << "Muon: " << spec.name << " is split over " << spec.split_parts << " ranks, the "
        << (expert_tp ? "expert-" : "") << "tensor-parallel group has " << (group ? group->size() : 1);
  }
  // The matrix to orthogonalise: the whole one (duplicated mode, gathered over TP) or the local
  // shard (distributed mode: orthogonalised whole through collectives; blockwise: on its own).
  const bool gather = mc.tp_mode == "duplicated" && split;
  const bool sharded = mc.tp_mode == "distributed" && split;
  const Shape shape = gather ? spec.global_shape : spec.local_shape();
  const int64_t rows = shape[0], cols = shape[1], numel = rows * cols, local = spec.local_numel();
  std::vector<float> m(static_cast<size_t>(numel));
  if (gather) {
    // Shards may differ in size (--unaligned-linear): gathered padded to the largest.
    ParamSpec other = spec;
    int64_t largest = 0;
    for (int64_t r = 0; r < spec.split_parts; ++r) {
      other.split_rank = r;
      largest = std::max(largest, other.local_numel());
    }
    std::vector<float> mine(static_cast<size_t>(largest), 0.0f);
    std::copy(u, u + local, mine.begin());
    std::vector<float> shards(static_cast<size_t>(largest * spec.split_parts));
    group->all_gather(mine.data(), shards.data(), largest, DType::kF32);
    for (int64_t r = 0; r < spec.split_parts; ++r) {
      other.split_rank = r;
      const float* shard = shards.data() + r * largest;
      for (int64_t i = 0, n = other.local_numel(); i < n; ++i) m[static_cast<size_t>(other.global_index(i))] = shard[i];
    }
  } else {
    std::copy(u, u + numel, m.data());
  }
  const float extra = static_cast<float>(mc.extra_scale_factor);
  const NsAllReduce sum = [&group](float* data, int64_t n) { group->all_reduce(data, n, DType::kF32, ReduceOp::kSum); };
  // Orthogonalises block [r, c] in place (sharded: this rank's part of a matrix whose whole has
  // `whole_rows` rows and the global columns) and scales it by the whole matrix's factor.
  auto orthogonalise = [&](float* block, int64_t r, int64_t c, int64_t whole_rows) {
    if (sharded)
      newton_schulz_sharded(block, block, r, c, spec.split_dim, mc.num_ns_steps, ns_coefficients_, bf16, sum,
                            ops_->gemm);
    else
      newton_schulz(block, block, r, c, mc.num_ns_steps, ns_coefficients_, bf16, ops_->gemm);
    const int64_t whole_cols = sharded ? spec.global_shape[1] : c;
    const float scale = static_cast<float>(*muon_scale_factor(whole_rows, whole_cols, mc.scale_mode));
    for (int64_t i = 0; i < r * c; ++i) block[i] = block[i] * scale * extra;
  };
  const int64_t per = std::accumulate(qkv_split.begin(), qkv_split.end(), int64_t{0});
  // The same choice on every rank of the group: by the whole matrix's rows.
  const int64_t whole_rows = sharded ? spec.global_shape[0] : rows;
  if (mc.split_qkv && per > 0 && whole_rows % per == 0) {
    GALE_CHECK_EQ(rows % per, 0) << "Muon: " << spec.name << "'s rows are not whole query groups";
    const int64_t groups = rows / per, whole_groups = whole_rows / per;
    int64_t first = 0;
    std::vector<float> block;
    for (int64_t count : qkv_split) {
      block.resize(static_cast<size_t>(groups * count * cols));
      group_rows(m.data(), groups, per, first, count, cols, block.data(), false);
      orthogonalise(block.data(), groups * count, cols, whole_groups * count);
      group_rows(m.data(), groups, per, first, count, cols, block.data(), true);
      first += count;
    }
  } else {
    orthogonalise(m.data(), rows, cols, whole_rows);
  }
  if (gather) {
    for (int64_t i = 0; i < local; ++i) out[i] = m[static_cast<size_t>(spec.global_index(i))];
  } else {
    std::copy(m.begin(), m.end(), out);
  }
}

void Optimizer::gather_layer_wise(BufferState& b) {
  const std::vector<int>& owner = b.buffer.layer_wise_owner;
  if (owner.empty()) return;
  ParamBuffer& pb = *b.buffer.params;
  for (const bool expert : {false, true}) {
    const Comm& group = expert ? expert_groups_.shard_group : shard_group_;
    if (!group || group->size() == 1) continue;
    const int size = group->size(), me = group->rank();
    // Each rank's parameters, in id order, packed: rank r's block of the gather holds them.
    std::vector<std::vector<int>> ids(static_cast<size_t>(size));
    std::vector<int64_t> numel(static_cast<size_t>(size), 0);
    for (int id = 0; id < pb.size(); ++id) {
      const int r = owner[static_cast<size_t>(id)];
      if (r < 0 || pb.spec(id).expert_parallel != expert) continue;
      GALE_CHECK(r < size) << "layer-wise owner " << r << " of " << pb.spec(id).name << " in a group of " << size;
      ids[static_cast<size_t>(r)].push_back(id);
      numel[static_cast<size_t>(r)] += pb.spec(id).local_numel();
    }
    const int64_t largest = *std::max_element(numel.begin(), numel.end());
    if (largest == 0) continue;
    std::vector<float> mine(static_cast<size_t>(largest), 0.0f), all(static_cast<size_t>(largest * size));
    int64_t at = 0;
    for (int id : ids[static_cast<size_t>(me)]) {
      const ParamSpec& s = pb.spec(id);
      pb.read_values(s.offset, s.local_numel(), mine.data() + at);
      at += s.local_numel();
    }
    group->all_gather(mine.data(), all.data(), largest, DType::kF32);
    for (int r = 0; r < size; ++r) {
      if (r == me) continue;
      at = static_cast<int64_t>(r) * largest;
      for (int id : ids[static_cast<size_t>(r)]) {
        const ParamSpec& s = pb.spec(id);
        pb.write_values(s.offset, s.local_numel(), all.data() + at);
        at += s.local_numel();
      }
    }
  }
}

void Optimizer::muon_step(BufferState& b, const Segment& seg, float* p, float* g, double lr, float wd) {
  const MuonConfig& mc = config_.muon;
  const ParamSpec& spec = b.buffer.params->spec(seg.param_id);
  GALE_CHECK_EQ(seg.numel, spec.local_numel()) << "Muon updates whole parameters";
  const int64_t n = seg.numel;
  float* buf = b.exp_avg.data<float>() + seg.state_offset;
  // Decoupled weight decay first (emerging_optimizers' WeightDecayMixin, "decoupled").
  const float decay = static_cast<float>(-static_cast<double>(wd) * lr);
  if (wd != 0.0f)
    for (int64_t i = 0; i < n; ++i) p[i] = std::fma(p[i], decay, p[i]);
  const float w = static_cast<float>(1.0 - mc.momentum), mom = static_cast<float>(mc.momentum);
  std::vector<float> u(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    buf[i] = lerp(buf[i], g[i], w);
    u[static_cast<size_t>(i)] = mc.nesterov ? lerp(g[i], buf[i], mom) : buf[i];
  }
  std::vector<float> update(static_cast<size_t>(n));
  const size_t id = static_cast<size_t>(seg.param_id);
  muon_update(spec, b.buffer.qkv_split[id], b.buffer.expert_tp[id], u.data(), update.data());
  const float step = static_cast<float>(-lr);
  for (int64_t i = 0; i < n; ++i) p[i] = std::fma(update[static_cast<size_t>(i)], step, p[i]);
}

}  // namespace gale
