// MindSpeed's automated pipeline, memory mode: profiling, search and policy file (train/automated_pipeline.h).
#include "train/automated_pipeline.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <limits>
#include <sstream>

#include "core/allocator.h"
#include "core/log.h"
#include "model/layer_profile.h"
#include "parallel/rank_grid.h"
#include "schedule/pipeline_order.h"
#include "train/trainer.h"

namespace gale {

namespace {

constexpr const char* kFormat = "gale-automated-pipeline";
constexpr int kVersion = 1;

// Layers per stage of the profiling run: L/P each, the remainder one more on the last stages
// (the first stages hold the most micro-batches in flight).
std::vector<int64_t> even_split(int64_t L, int64_t P) {
  std::vector<int64_t> split(static_cast<size_t>(P), L / P);
  for (int64_t s = P - L % P; s < P; ++s) ++split[static_cast<size_t>(s)];
  return split;
}

// The pipeline stage of this rank (Megatron's layout, parallel/rank_grid.h).
size_t pipeline_rank(const Arguments& args, const Comm& world) {
  StatusOr<RankLayout> layout = compute_rank_layout(parallel_sizes_from_args(args, world->size()));
  return layout.ok() ? static_cast<size_t>(layout.value().coords(world->rank()).pp) : 0;
}

// C(n, k), saturating at `cap`.
int64_t binomial_capped(int64_t n, int64_t k, int64_t cap) {
  if (k < 0 || k > n) return 0;
  k = std::min(k, n - k);
  double r = 1.0;
  for (int64_t i = 1; i <= k; ++i) {
    r = r * static_cast<double>(n - k + i) / static_cast<double>(i);
    if (r > static_cast<double>(cap)) return cap + 1;
  }
  return static_cast<int64_t>(std::llround(r));
}

std::string join(const std::vector<int64_t>& v) {
  std::string s;
  for (int64_t x : v) s += str_cat(s.empty() ? "" : ",", x);
  return s;
}

}  // namespace

double simulate_one_f_one_b(const std::vector<double>& forward_s, const std::vector<double>& backward_s,
                            int64_t num_microbatches) {
  const int P = static_cast<int>(forward_s.size());
  const int64_t M = num_microbatches;
  std::vector<std::vector<PipelineStep>> orders;
  for (int r = 0; r < P; ++r) orders.push_back(one_f_one_b_order(P, r, M, /*forward_only=*/false));
  std::vector<std::vector<double>> fend(static_cast<size_t>(P), std::vector<double>(static_cast<size_t>(M), -1.0));
  std::vector<std::vector<double>> bend = fend;
  std::vector<size_t> next(static_cast<size_t>(P), 0);
  std::vector<double> clock(static_cast<size_t>(P), 0.0);
  for (bool moved = true; moved;) {
    moved = false;
    for (int s = 0; s < P; ++s) {
      const auto us = static_cast<size_t>(s);
      while (next[us] < orders[us].size()) {
        const PipelineStep& step = orders[us][next[us]];
        const auto m = static_cast<size_t>(step.microbatch);
        double ready = 0.0;
        if (step.forward && s > 0) ready = fend[us - 1][m];
        if (!step.forward && s < P - 1) ready = bend[us + 1][m];
        if (ready < 0.0) break;  // its input is not there yet
        const double end = std::max(clock[us], ready) + (step.forward ? forward_s[us] : backward_s[us]);
        (step.forward ? fend : bend)[us][m] = end;
        clock[us] = end;
        ++next[us];
        moved = true;
      }
    }
  }
  for (int s = 0; s < P; ++s)
    GALE_CHECK_EQ(next[static_cast<size_t>(s)], orders[static_cast<size_t>(s)].size()) << "1F1B simulation stalled";
  return *std::max_element(clock.begin(), clock.end());
}

int64_t stage_memory_bytes(const PipelineProfile& p, int64_t stage, int64_t first, int64_t layers, int64_t recompute) {
  const int64_t P = p.pipeline_size;
  int64_t static_bytes = 0, kept = 0, rerun = 0;
  for (int64_t l = first; l < first + layers; ++l) {
    const auto i = static_cast<size_t>(l);
    static_bytes += p.layer_static_bytes[i];
    if (l - first < recompute) {
      kept += p.layer_input_bytes[i];
      rerun = std::max(rerun, p.layer_kept_bytes[i] - p.layer_input_bytes[i]);
    } else {
      kept += p.layer_kept_bytes[i];
    }
  }
  if (stage == 0) {
    static_bytes += p.embedding_static_bytes;
    kept += p.embedding_kept_bytes;
  }
  if (stage == P - 1) {
    static_bytes += p.head_static_bytes;
    kept += p.head_kept_bytes;
  }
  const int64_t in_flight = std::min(P - stage, std::max<int64_t>(1, p.num_microbatches));
  return static_bytes + in_flight * kept + rerun;
}

PipelinePolicy search_pipeline_policy(const PipelineProfile& p, double save_memory_ratio) {
  const int64_t L = p.num_layers, P = p.pipeline_size;
  GALE_CHECK(P >= 2 && L >= P) << "automated pipeline search: " << L << " layers on " << P << " stages";
  PipelinePolicy best;
  // The limit: (1 - ratio) x the largest stage of the profiled split without recomputation.
  int64_t first = 0, even_max = 0;
  std::vector<double> even_fwd(static_cast<size_t>(P)), even_bwd(static_cast<size_t>(P));
  for (int64_t s = 0; s < P; ++s) {
    const int64_t n = p.profiled_split[static_cast<size_t>(s)];
    best.even_stage_bytes.push_back(stage_memory_bytes(p, s, first, n, 0));
    even_max = std::max(even_max, best.even_stage_bytes.back());
    for (int64_t l = first; l < first + n; ++l) {
      even_fwd[static_cast<size_t>(s)] += p.layer_forward_s[static_cast<size_t>(l)];
      even_bwd[static_cast<size_t>(s)] += p.layer_backward_s[static_cast<size_t>(l)];
    }
    first += n;
  }
  even_fwd.front() += p.embedding_forward_s;
  even_bwd.front() += p.embedding_backward_s;
  even_fwd.back() += p.head_forward_s;
  even_bwd.back() += p.head_backward_s;
  best.even_step_seconds = simulate_one_f_one_b(even_fwd, even_bwd, std::max<int64_t>(1, p.num_microbatches));
  const int64_t limit = static_cast<int64_t>(std::floor((1.0 - save_memory_ratio) * static_cast<double>(even_max)));
  // The splits: ≥ 1 layer per stage; when too many, MindSpeed's window around the average
  // (±0 up to 4 layers per stage, ±1 up to 7, ±2 beyond).
  int64_t lo = 1, hi = L - (P - 1);
  if (binomial_capped(L - 1, P - 1, kMaxFullSearch) > kMaxFullSearch) {
    const int64_t avg = (L + P / 2) / P;
    const int64_t range = avg <= 4 ? 0 : avg < 8 ? 1 : 2;
    lo = std::max<int64_t>(1, avg - range);
    hi = avg + range;
  }
  bool have = false;
  int64_t best_max_bytes = 0;
  std::vector<int64_t> split(static_cast<size_t>(P));
  auto evaluate = [&] {
    PipelinePolicy c;
    c.num_layer_list = split;
    c.memory_limit_bytes = limit;
    std::vector<double> fwd(static_cast<size_t>(P)), bwd(static_cast<size_t>(P));
    int64_t f = 0, max_bytes = 0;
    for (int64_t s = 0; s < P; ++s) {
      const int64_t n = split[static_cast<size_t>(s)];
      int64_t r = 0;  // the fewest recomputed layers that fit
      while (r < n && stage_memory_bytes(p, s, f, n, r) > limit) ++r;
      const int64_t bytes = stage_memory_bytes(p, s, f, n, r);
      if (bytes > limit) c.feasible = false;
      c.recompute_module_list.push_back(r);
      c.stage_bytes.push_back(bytes);
      max_bytes = std::max(max_bytes, bytes);
      double tf = 0.0, tb = 0.0;
      for (int64_t l = f; l < f + n; ++l) {
        tf += p.layer_forward_s[static_cast<size_t>(l)];
        tb += p.layer_backward_s[static_cast<size_t>(l)];
        if (l - f < r) tb += p.layer_forward_s[static_cast<size_t>(l)];  // the rerun
      }
      if (s == 0) tf += p.embedding_forward_s, tb += p.embedding_backward_s;
      if (s == P - 1) tf += p.head_forward_s, tb += p.head_backward_s;
      fwd[static_cast<size_t>(s)] = tf;
      bwd[static_cast<size_t>(s)] = tb;
      f += n;
    }
    c.step_seconds = simulate_one_f_one_b(fwd, bwd, std::max<int64_t>(1, p.num_microbatches));
    ++best.candidates;
    bool better = !have;
    if (have && c.feasible != best.feasible) better = c.feasible;
    else if (have && c.feasible) better = c.step_seconds < best.step_seconds ||
                                          (c.step_seconds == best.step_seconds && max_bytes < best_max_bytes);
    else if (have) better = max_bytes < best_max_bytes || (max_bytes == best_max_bytes && c.step_seconds < best.step_seconds);
    if (better) {
      c.candidates = best.candidates;
      c.even_stage_bytes = best.even_stage_bytes;
      c.even_step_seconds = best.even_step_seconds;
      best = std::move(c);
      best_max_bytes = max_bytes;
      have = true;
    }
  };
  // Stage s's count, descending, with the rest still placeable.
  auto place = [&](auto&& self, int64_t s, int64_t left) -> void {
    if (s == P - 1) {
      if (left < lo || left > hi) return;
      split[static_cast<size_t>(s)] = left;
      evaluate();
      return;
    }
    const int64_t stages_after = P - 1 - s;
    for (int64_t n = std::min(hi, left - stages_after * lo); n >= lo; --n) {
      if (left - n > stages_after * hi) break;
      split[static_cast<size_t>(s)] = n;
      self(self, s + 1, left - n);
    }
  };
  place(place, 0, L);
  GALE_CHECK(have) << "automated pipeline search: no split of " << L << " layers on " << P << " stages";
  return best;
}

StatusOr<PipelineProfile> profile_pipeline(const Arguments& args, const Comm& world, const OpTable& ops,
                                           const EngineOptions& options, const SampleDataset* train) {
  const int64_t L = args.model.num_layers, P = args.parallel.pipeline_model_parallel_size;
  PipelineProfile prof;
  prof.num_layers = L;
  prof.pipeline_size = P;
  prof.profiled_split = even_split(L, P);
  Arguments pa = args;
  pa.parallel.pipeline_layers.clear();
  for (int64_t n : prof.profiled_split) pa.parallel.pipeline_layers.push_back({n});
  pa.parallel.recompute_layers_per_stage.clear();
  const int64_t base_bytes = host_allocator().current_bytes();
  GALE_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, build_engine(pa, world, ops, options));
  LayerProfiler recorder;
  for (const auto& c : engine->chunks) c->set_layer_profiler(&recorder);
  Trainer trainer(pa, engine.get(), train, nullptr, nullptr);
  const ParallelState& ps = engine->ps;
  prof.num_microbatches = pa.training.global_batch_size / (pa.training.micro_batch_size * std::max(1, ps.dp_size()));
  int64_t static_bytes = 0;
  for (int64_t it = 0; it < kProfileIterations; ++it) {
    if (it == 1) {  // after the warm-up: parameters, gradients and optimizer state are what stays
      static_bytes = host_allocator().current_bytes() - base_bytes;
      host_allocator().reset_peak();
      recorder.recording = true;
    }
    GALE_RETURN_IF_ERROR(trainer.train_step().status());
  }
  recorder.recording = false;
  const int64_t peak = host_allocator().peak_bytes() - base_bytes;
  for (const auto& c : engine->chunks) c->set_layer_profiler(nullptr);

  // Parameter elements per layer (or embedding / head) on this rank, to share the static bytes.
  const int pp_rank = ps.coords().pp;
  std::vector<double> numel(static_cast<size_t>(L + 2), 0.0);  // layers, then embedding, head
  double total_numel = 0.0;
  const std::string prefix = "decoder.layers.";
  for (const auto& c : engine->chunks) {
    const ParamBuffer& pb = c->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& spec = pb.spec(id);
      const auto n = static_cast<double>(spec.local_numel());
      total_numel += n;
      size_t slot = static_cast<size_t>(pp_rank == 0 ? L : L + 1);
      if (spec.name.compare(0, prefix.size(), prefix) == 0) {
        const int64_t layer = std::atoll(spec.name.c_str() + prefix.size());
        if (layer >= 0 && layer < L) slot = static_cast<size_t>(layer);
      }
      numel[slot] += n;
    }
  }
  const double bytes_per_element = total_numel > 0.0 ? static_cast<double>(static_bytes) / total_numel : 0.0;

  // Gathered as doubles: per layer {forward s, backward s, kept, input, static}, then the
  // embedding's and the head's {forward s, backward s, kept, static}; summed over the world, then
  // divided by the replicas of each stage (tensor, context and data parallel ranks).
  const size_t n_layer = 5;
  std::vector<double> buf(static_cast<size_t>(L) * n_layer + 8, 0.0);
  const double per_mb = 1.0 / static_cast<double>((kProfileIterations - 1) * prof.num_microbatches);
  for (const auto& [key, cost] : recorder.costs) {
    if (key >= 0) {
      double* b = &buf[static_cast<size_t>(key) * n_layer];
      b[0] = cost.forward_seconds * per_mb;
      b[1] = cost.backward_seconds * per_mb;
      b[2] = static_cast<double>(cost.kept_bytes) * per_mb;
      b[3] = static_cast<double>(cost.input_bytes) * per_mb;
      b[4] = std::round(numel[static_cast<size_t>(key)] * bytes_per_element);
    } else {
      const bool emb = key == LayerProfiler::kEmbedding;
      double* b = &buf[static_cast<size_t>(L) * n_layer + (emb ? 0 : 4)];
      b[0] = cost.forward_seconds * per_mb;
      b[1] = cost.backward_seconds * per_mb;
      b[2] = static_cast<double>(cost.kept_bytes) * per_mb;
      b[3] = std::round(numel[static_cast<size_t>(emb ? L : L + 1)] * bytes_per_element);
    }
  }
  world->all_reduce(buf.data(), static_cast<int64_t>(buf.size()), DType::kF64, ReduceOp::kSum);
  const double replicas = static_cast<double>(world->size() / P);
  for (double& v : buf) v /= replicas;
  std::vector<double> peaks(static_cast<size_t>(P), 0.0);
  peaks[static_cast<size_t>(pp_rank)] = static_cast<double>(peak);
  world->all_reduce(peaks.data(), P, DType::kF64, ReduceOp::kMax);
  auto bytes = [](double v) { return static_cast<int64_t>(std::llround(v)); };
  for (int64_t l = 0; l < L; ++l) {
    const double* b = &buf[static_cast<size_t>(l) * n_layer];
    prof.layer_forward_s.push_back(b[0]);
    prof.layer_backward_s.push_back(b[1]);
    prof.layer_kept_bytes.push_back(bytes(b[2]));
    prof.layer_input_bytes.push_back(bytes(b[3]));
    prof.layer_static_bytes.push_back(bytes(b[4]));
  }
  const double* e = &buf[static_cast<size_t>(L) * n_layer];
  prof.embedding_forward_s = e[0];
  prof.embedding_backward_s = e[1];
  prof.embedding_kept_bytes = bytes(e[2]);
  prof.embedding_static_bytes = bytes(e[3]);
  prof.head_forward_s = e[4];
  prof.head_backward_s = e[5];
  prof.head_kept_bytes = bytes(e[6]);
  prof.head_static_bytes = bytes(e[7]);
  for (double v : peaks) prof.measured_peak_bytes.push_back(bytes(v));
  return prof;
}

nlohmann::json automated_pipeline_key(const Arguments& args) {
  const ModelArgs& m = args.model;
  const ParallelArgs& par = args.parallel;
  return nlohmann::json{{"num_layers", m.num_layers},
                        {"hidden_size", m.hidden_size},
                        {"ffn_hidden_size", m.ffn_hidden_size},
                        {"num_attention_heads", m.num_attention_heads},
                        {"seq_length", m.seq_length},
                        {"padded_vocab_size", m.padded_vocab_size},
                        {"micro_batch_size", args.training.micro_batch_size},
                        {"global_batch_size", args.training.global_batch_size},
                        {"pipeline_model_parallel_size", par.pipeline_model_parallel_size},
                        {"tensor_model_parallel_size", par.tensor_model_parallel_size},
                        {"context_parallel_size", par.context_parallel_size},
                        {"data_parallel_size", par.data_parallel_size},
                        {"save_memory_ratio", par.save_memory_ratio}};
}

namespace {

// The file's contents: nullopt when it does not exist.
StatusOr<std::optional<nlohmann::json>> read_policy_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return std::optional<nlohmann::json>();
  std::stringstream text;
  text << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  const std::string what = str_cat("--automated-pipeline-config ", path, ": ");
  if (j.is_discarded() || !j.is_object()) return DataLoss(what, "not JSON (expected a \"", kFormat, "\" object)");
  if (j.value("format", std::string()) != kFormat)
    return InvalidArgument(what, "expected \"format\": \"", kFormat, "\", found ",
                           j.contains("format") ? j["format"].dump() : std::string("none"));
  if (!j.contains("version") || !j["version"].is_number_integer() || j["version"].get<int>() != kVersion)
    return InvalidArgument(what, "expected \"version\": ", kVersion, ", found ",
                           j.contains("version") ? j["version"].dump() : std::string("none"));
  if (!j.contains("policies") || !j["policies"].is_array()) return DataLoss(what, "no \"policies\" array");
  return std::optional<nlohmann::json>(std::move(j));
}

std::vector<int64_t> int_list(const nlohmann::json& j) {
  std::vector<int64_t> v;
  if (j.is_array())
    for (const auto& x : j) v.push_back(x.is_number_integer() ? x.get<int64_t>() : -1);
  return v;
}

}  // namespace

StatusOr<std::optional<PipelinePolicy>> find_pipeline_policy(const std::string& path, const nlohmann::json& key) {
  GALE_ASSIGN_OR_RETURN(std::optional<nlohmann::json> file, read_policy_file(path));
  if (!file) return std::optional<PipelinePolicy>();
  for (const nlohmann::json& entry : (*file)["policies"]) {
    if (!entry.is_object() || !entry.contains("key") || entry["key"] != key) continue;
    PipelinePolicy p;
    p.num_layer_list = int_list(entry.value("num_layer_list", nlohmann::json()));
    p.recompute_module_list = int_list(entry.value("recompute_module_list", nlohmann::json()));
    const int64_t P = key.at("pipeline_model_parallel_size").get<int64_t>();
    const int64_t L = key.at("num_layers").get<int64_t>();
    int64_t sum = 0;
    bool ok = static_cast<int64_t>(p.num_layer_list.size()) == P &&
              static_cast<int64_t>(p.recompute_module_list.size()) == P && entry.value("recompute_type", -1) == 2;
    for (size_t s = 0; ok && s < p.num_layer_list.size(); ++s) {
      ok = p.num_layer_list[s] >= 1 && p.recompute_module_list[s] >= 0 &&
           p.recompute_module_list[s] <= p.num_layer_list[s];
      sum += p.num_layer_list[s];
    }
    if (!ok || sum != L)
      return InvalidArgument("--automated-pipeline-config ", path, ": the entry for this run has num_layer_list [",
                             join(p.num_layer_list), "] and recompute_module_list [", join(p.recompute_module_list),
                             "]: expected ", P, " stage counts ≥ 1 summing to ", L,
                             ", as many recompute counts each ≤ its stage's layers, and recompute_type 2");
    const nlohmann::json pred = entry.value("predicted", nlohmann::json::object());
    p.step_seconds = pred.value("step_time_ms", 0.0) / 1e3;
    p.stage_bytes = int_list(pred.value("stage_memory_bytes", nlohmann::json()));
    p.memory_limit_bytes = pred.value("memory_limit_bytes", int64_t{0});
    p.feasible = pred.value("feasible", true);
    return std::optional<PipelinePolicy>(std::move(p));
  }
  return std::optional<PipelinePolicy>();
}

Status append_pipeline_policy(const std::string& path, const nlohmann::json& key, const PipelinePolicy& policy,
                              const PipelineProfile& profile) {
  GALE_ASSIGN_OR_RETURN(std::optional<nlohmann::json> file, read_policy_file(path));
  nlohmann::json j = file ? *file : nlohmann::json{{"format", kFormat}, {"version", kVersion}, {"policies", nlohmann::json::array()}};
  nlohmann::json prof{{"iterations", kProfileIterations - 1},
                      {"num_microbatches", profile.num_microbatches},
                      {"profiled_split", profile.profiled_split},
                      {"layer_forward_ms", nlohmann::json::array()},
                      {"layer_backward_ms", nlohmann::json::array()},
                      {"layer_kept_bytes", profile.layer_kept_bytes},
                      {"layer_input_bytes", profile.layer_input_bytes},
                      {"layer_static_bytes", profile.layer_static_bytes},
                      {"embedding", {{"forward_ms", profile.embedding_forward_s * 1e3},
                                     {"backward_ms", profile.embedding_backward_s * 1e3},
                                     {"kept_bytes", profile.embedding_kept_bytes},
                                     {"static_bytes", profile.embedding_static_bytes}}},
                      {"head", {{"forward_ms", profile.head_forward_s * 1e3},
                                {"backward_ms", profile.head_backward_s * 1e3},
                                {"kept_bytes", profile.head_kept_bytes},
                                {"static_bytes", profile.head_static_bytes}}},
                      {"measured_peak_bytes", profile.measured_peak_bytes}};
  for (double s : profile.layer_forward_s) prof["layer_forward_ms"].push_back(s * 1e3);
  for (double s : profile.layer_backward_s) prof["layer_backward_ms"].push_back(s * 1e3);
  j["policies"].push_back({{"key", key},
                           {"num_layer_list", policy.num_layer_list},
                           {"recompute_module_list", policy.recompute_module_list},
                           {"recompute_type", 2},
                           {"predicted", {{"step_time_ms", policy.step_seconds * 1e3},
                                          {"stage_memory_bytes", policy.stage_bytes},
                                          {"even_split_stage_memory_bytes", policy.even_stage_bytes},
                                          {"even_split_step_time_ms", policy.even_step_seconds * 1e3},
                                          {"memory_limit_bytes", policy.memory_limit_bytes},
                                          {"feasible", policy.feasible},
                                          {"candidates", policy.candidates}}},
                           {"profile", prof}});
  const std::string tmp = str_cat(path, ".tmp");
  {
    std::ofstream out(tmp, std::ios::trunc);
    out << j.dump(1) << "\n";
    if (!out) return InvalidArgument("--automated-pipeline-config ", path, ": cannot write ", tmp);
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0)
    return InvalidArgument("--automated-pipeline-config ", path, ": cannot replace it with ", tmp);
  return Status::Ok();
}

std::vector<std::string> describe_pipeline_policy(const PipelinePolicy& policy, bool from_file) {
  std::vector<std::string> lines;
  lines.push_back("=============================================");
  lines.push_back(from_file ? "[automated pipeline] applied policy (from --automated-pipeline-config, no profiling):"
                            : "[automated pipeline] applied policy:");
  lines.push_back(str_cat("  network layer setting (--num-layer-list): ", join(policy.num_layer_list)));
  lines.push_back(str_cat("  recompute policy setting (first layers of each stage, full layers): ",
                          join(policy.recompute_module_list)));
  lines.push_back("  recompute type: 2 (transformer layer)");
  if (!from_file || !policy.stage_bytes.empty()) {
    char ms[64];
    std::snprintf(ms, sizeof ms, "%.3f", policy.step_seconds * 1e3);
    lines.push_back(str_cat("  predicted 1F1B step: ", ms, " ms; stage memory (bytes): ", join(policy.stage_bytes),
                            " under the limit ", policy.memory_limit_bytes,
                            policy.feasible ? "" : " (NOT met: no split fits; the least-memory one)"));
  }
  if (!from_file) {
    char ms[64];
    std::snprintf(ms, sizeof ms, "%.3f", policy.even_step_seconds * 1e3);
    lines.push_back(str_cat("  even split (the model, no recompute): step ", ms, " ms, stage memory (bytes) ",
                            join(policy.even_stage_bytes), "; ", policy.candidates, " splits evaluated"));
  }
  lines.push_back("=============================================");
  return lines;
}

StatusOr<AutomatedPipelineStage> run_automated_pipeline(Arguments& args, const Comm& world, const OpTable& ops,
                                                        const EngineOptions& options, const SampleDataset* train) {
  const int64_t P = args.parallel.pipeline_model_parallel_size;
  const std::string& path = args.parallel.automated_pipeline_config;
  const nlohmann::json key = automated_pipeline_key(args);
  // Rank 0 reads the file and decides; the others follow its broadcast (found, then the layers,
  // the recomputed layers and the predicted bytes of every stage).
  std::vector<int64_t> msg(static_cast<size_t>(3 * P + 1), 0);
  AutomatedPipelineStage mine;
  Status file_status = Status::Ok();
  std::optional<PipelinePolicy> found;
  if (world->rank() == 0) {
    StatusOr<std::optional<PipelinePolicy>> f = find_pipeline_policy(path, key);
    if (!f.ok()) {
      file_status = f.status();
      msg[0] = -1;
    } else if (f.value()) {
      found = f.value();
      msg[0] = 1;
      for (int64_t s = 0; s < P; ++s) {
        msg[static_cast<size_t>(1 + s)] = found->num_layer_list[static_cast<size_t>(s)];
        msg[static_cast<size_t>(1 + P + s)] = found->recompute_module_list[static_cast<size_t>(s)];
        msg[static_cast<size_t>(1 + 2 * P + s)] =
            static_cast<int64_t>(found->stage_bytes.size()) == P ? found->stage_bytes[static_cast<size_t>(s)] : -1;
      }
    }
  }
  world->broadcast(msg.data(), static_cast<int64_t>(msg.size()), DType::kI64, 0);
  if (msg[0] < 0)
    return world->rank() == 0 ? file_status
                              : InvalidArgument("--automated-pipeline-config ", path, ": refused on rank 0");
  PipelinePolicy policy;
  if (msg[0] == 0) {
    print_rank0(str_cat("[automated pipeline] profiling ", kProfileIterations, " iterations at the even split (",
                        join(even_split(args.model.num_layers, P)), "), the first not recorded"));
    GALE_ASSIGN_OR_RETURN(PipelineProfile profile, profile_pipeline(args, world, ops, options, train));
    mine.even_peak_bytes = profile.measured_peak_bytes[pipeline_rank(args, world)];
    if (world->rank() == 0) {
      policy = search_pipeline_policy(profile, args.parallel.save_memory_ratio);
      for (int64_t s = 0; s < P; ++s) {
        msg[static_cast<size_t>(1 + s)] = policy.num_layer_list[static_cast<size_t>(s)];
        msg[static_cast<size_t>(1 + P + s)] = policy.recompute_module_list[static_cast<size_t>(s)];
        msg[static_cast<size_t>(1 + 2 * P + s)] = policy.stage_bytes[static_cast<size_t>(s)];
      }
      for (const std::string& line : describe_pipeline_policy(policy, false)) print_rank0(line);
      file_status = append_pipeline_policy(path, key, policy, profile);
      if (file_status.ok()) print_rank0(str_cat("[automated pipeline] policy appended to ", path));
      else msg[0] = -1;
    }
    world->broadcast(msg.data(), static_cast<int64_t>(msg.size()), DType::kI64, 0);
    if (msg[0] < 0)
      return world->rank() == 0 ? file_status
                                : InvalidArgument("--automated-pipeline-config ", path, ": not written on rank 0");
  } else if (world->rank() == 0) {
    for (const std::string& line : describe_pipeline_policy(*found, true)) print_rank0(line);
  }
  args.parallel.pipeline_layers.clear();
  args.parallel.recompute_layers_per_stage.clear();
  for (int64_t s = 0; s < P; ++s) {
    args.parallel.pipeline_layers.push_back({msg[static_cast<size_t>(1 + s)]});
    args.parallel.recompute_layers_per_stage.push_back(msg[static_cast<size_t>(1 + P + s)]);
  }
  mine.predicted_bytes = msg[static_cast<size_t>(1 + 2 * P) + pipeline_rank(args, world)];
  return mine;
}

}  // namespace gale
