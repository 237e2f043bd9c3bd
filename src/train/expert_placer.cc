// Expert placement after the optimizer step: load prediction, greedy re-placement, migration.
#include "train/expert_placer.h"

#include <cstring>
#include <sstream>

#include "core/check.h"
#include "core/log.h"
#include "model/expert_placement.h"
#include "model/lora.h"
#include "train/engine.h"

namespace gale {

namespace {

std::string join_loads(const std::vector<double>& v) {
  std::ostringstream o;
  o.setf(std::ios::fixed);
  o.precision(1);
  o << "[";
  for (size_t i = 0; i < v.size(); ++i) o << (i ? ", " : "") << v[i];
  o << "]";
  return o.str();
}

// The parameter ids of local slot j, in a fixed order: the expert's, then its LoRA adapters' (found
// by name beside fc1 / fc2, model/lora_expert.h).
std::vector<int> slot_ids(const ParamBuffer& pb, const MoeParamIds& w, size_t j) {
  std::vector<int> ids;
  for (int id : {w.fc1_w[j], w.fc1_b[j], w.fc2_w[j], w.fc2_b[j]})
    if (id >= 0) ids.push_back(id);
  for (int id : {w.fc1_w[j], w.fc2_w[j]})
    for (int adapter : {pb.find(lora_a_name(pb.spec(id).name)), pb.find(lora_b_name(pb.spec(id).name))})
      if (adapter >= 0) ids.push_back(adapter);
  return ids;
}

}  // namespace

std::string renamed_expert(const std::string& name, int64_t expert) {
  static const std::string kKey = "local_experts.";
  const size_t at = name.find(kKey);
  GALE_CHECK(at != std::string::npos) << name;
  const size_t first = at + kKey.size(), end = name.find('.', first);
  GALE_CHECK(end != std::string::npos) << name;
  return name.substr(0, first) + std::to_string(expert) + name.substr(end);
}

ExpertPlacer::ExpertPlacer(const ExpertPlacementConfig& config, Engine& engine) : config_(config) {
  GALE_CHECK(config_.freq >= 1) << "--expert-placement-freq " << config_.freq;
  for (auto& chunk : engine.chunks) layers_.push_back(chunk->enable_expert_placement());
}

void ExpertPlacer::after_step(Engine& engine) {
  const ParallelState& ps = engine.ps;
  const Comm& ep = ps.expert();
  const int64_t P = ep ? ep->size() : 1;
  const int64_t dp = ps.dp_size(), edp = dp / P;
  const int64_t step = engine.optimizer->steps_taken();
  const bool place = step > 0 && step % config_.freq == 0 && step != last_placed_step_;  // (a skipped step: once)
  if (place) last_placed_step_ = step;
  for (size_t c = 0; c < layers_.size(); ++c) {
    for (auto& [layer, w] : layers_[c]) {
      MoePlacement& pl = *w->placement;
      const int64_t E = static_cast<int64_t>(pl.counts.size());
      std::vector<double> load(pl.counts.begin(), pl.counts.end());
      std::fill(pl.counts.begin(), pl.counts.end(), 0);
      if (ps.dp() && ps.dp()->size() > 1) ps.dp()->all_reduce(load.data(), E, DType::kF64, ReduceOp::kSum);
      for (int64_t e = 0; e < E; ++e)
        pl.predicted[e] = kExpertLoadEmaWeight * pl.predicted[e] +
                          (1.0 - kExpertLoadEmaWeight) * load[e] / static_cast<double>(edp);
      if (!place) continue;
      ExpertPlacementReport rep;
      rep.step = step;
      rep.layer = layer;
      rep.predicted = pl.predicted;
      const std::vector<int32_t> next = greedy_expert_placement(pl.predicted, P);
      rep.before = rank_loads(pl.predicted, pl.physical, P);
      rep.after = rank_loads(pl.predicted, next, P);
      rep.cv_before = coefficient_of_variation(rep.before);
      rep.cv_after = coefficient_of_variation(rep.after);
      const bool worth = !config_.fine_grained || rep.cv_before - rep.cv_after >= config_.fine_grained_thre;
      rep.migrated = worth && next != pl.physical;
      const double start = now_seconds();
      if (rep.migrated) migrate(engine, c, *w, next);
      rep.migration_seconds = now_seconds() - start;
      if (config_.print_load)
        print_rank0(str_cat("[expert load] step ", step, " layer ", layer, ": predicted tokens per expert ",
                            join_loads(rep.predicted), "; per EP rank ", join_loads(rep.before), " (cv ",
                            rep.cv_before, ") -> ", join_loads(rep.after), " (cv ", rep.cv_after, ")",
                            rep.migrated ? str_cat(", migrated in ", rep.migration_seconds, " s") : ", kept"));
      reports_.push_back(std::move(rep));
    }
  }
}

void ExpertPlacer::migrate(Engine& engine, size_t chunk, MoeParamIds& w, const std::vector<int32_t>& physical) {
  const Comm& ep = engine.ps.expert();
  const int64_t P = ep->size(), r = ep->rank();
  const int64_t El = static_cast<int64_t>(w.fc1_w.size());
  ParamBuffer& pb = engine.chunks[chunk]->params();
  Optimizer& opt = *engine.optimizer;
  GALE_CHECK(&opt.buffer_params(chunk) == &pb && !opt.sharded(chunk)) << "expert placement: chunk " << chunk;
  GALE_CHECK(opt.swap() == nullptr && !opt.quantised()) << "expert placement: the optimizer state must be resident f32";
  const std::vector<std::pair<std::string, Tensor>> states = opt.state(chunk);  // shared storage (no swap, no compression, no quant)
  // A slot's floats: per parameter its values and, when trainable, its gradient and every state
  // tensor's slice (under LoRA the expert is frozen: values only; its adapters move whole).
  const auto floats_of = [&](int id) {
    return pb.spec(id).local_numel() * (pb.spec(id).trainable ? static_cast<int64_t>(2 + states.size()) : 1);
  };
  int64_t slot_floats = 0;
  for (int id : slot_ids(pb, w, 0)) slot_floats += floats_of(id);
  std::vector<float> mine(static_cast<size_t>(El * slot_floats)), all(static_cast<size_t>(P * El * slot_floats));
  auto for_each_piece = [&](int64_t j, auto&& fn) {  // fn(pointer, numel) in the packing order
    for (int id : slot_ids(pb, w, static_cast<size_t>(j))) {
      const ParamSpec& s = pb.spec(id);
      const int64_t n = s.local_numel();
      fn(pb.param_data(id), n);
      if (!s.trainable) continue;
      fn(pb.grad_data(id), n);
      for (const auto& st : states) fn(st.second.data<float>() + s.offset, n);
    }
  };
  for (int64_t j = 0; j < El; ++j) {
    float* dst = mine.data() + j * slot_floats;
    for_each_piece(j, [&](const float* p, int64_t n) {
      std::memcpy(dst, p, static_cast<size_t>(n) * sizeof(float));
      dst += n;
    });
  }
  ep->all_gather(mine.data(), all.data(), El * slot_floats, DType::kF32);  // [P·El] slots in the old physical order
  const std::vector<int32_t> old_physical = w.placement->physical;
  w.placement->physical = physical;
  const std::vector<int32_t> global_of = w.placement->global_of_physical();
  for (int64_t j = 0; j < El; ++j) {
    const int32_t e = global_of[static_cast<size_t>(r * El + j)];
    const float* src = all.data() + static_cast<int64_t>(old_physical[e]) * slot_floats;
    for_each_piece(j, [&](float* p, int64_t n) {
      std::memcpy(p, src, static_cast<size_t>(n) * sizeof(float));
      src += n;
    });
    for (int id : slot_ids(pb, w, static_cast<size_t>(j))) pb.set_global_name(id, renamed_expert(pb.spec(id).global_name, e));
  }
  pb.refresh_gemm_copy();
}

}  // namespace gale
