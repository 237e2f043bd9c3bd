// Checkpoint save/load for the trainer on top of ckpt/ (sharded tensors + metadata sections).
#include "train/checkpointing.h"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <regex>
#include <set>
#include <nlohmann/json.hpp>

#include "ckpt/checkpoint_layout.h"
#include "ckpt/checkpoint_reader.h"
#include "ckpt/checkpoint_writer.h"
#include "ckpt/local_checkpoint.h"
#include "core/log.h"
#include "model/lora_modules.h"
#include "optim/shard_boxes.h"
#include "train/quant_state_checkpoint.h"
#include "train/checkpoint_args.h"
#include "train/grad_sync.h"
#include "train/megatron_checkpoint.h"
#include "train/megatron_moe_names.h"
#include "train/moe_upcycling.h"

namespace gale {

namespace {

constexpr int kTrainerStateVersion = 1;

// The pieces of a parameter's global tensor held by this rank: one box per TP block.
struct Piece {
  std::vector<int64_t> offsets;
  int64_t first_row = 0, rows = 0;  // rows of the local tensor (dim 0) forming the piece
};

std::vector<Piece> pieces_of(const ParamSpec& s) {
  Shape local = s.local_shape();
  std::vector<Piece> out;
  if (!s.is_split()) {
    out.push_back(Piece{std::vector<int64_t>(local.size(), 0), 0, local[0]});
    return out;
  }
  if (s.split_dim == 0) {
    for (int b = 0; b < s.split_blocks; ++b) {
      const ParamSpec::SplitBlock k = s.split_block(b);
      std::vector<int64_t> offsets(local.size(), 0);
      offsets[0] = k.global_start + k.offset;
      if (s.split2_parts > 1) offsets[1] = s.split2_offset();  // --tp-2d: this rank's columns
      out.push_back(Piece{offsets, k.local_start, k.rows});
    }
    return out;
  }
  GALE_CHECK_EQ(s.split_blocks, 1) << s.name;
  std::vector<int64_t> offsets(local.size(), 0);
  offsets[static_cast<size_t>(s.split_dim)] = s.split_block_offset();
  out.push_back(Piece{offsets, 0, local[0]});
  return out;
}

// Whether parameter `id` is the last pipeline stage's copy of the first stage's embedding (tied
// output weight, MTP layers): saved by the first stage, loaded by name into both.
bool is_embedding_copy(const GPTModel& model, int id) {
  if (model.partition().pre_process) return false;
  const std::vector<int> copies = model.embedding_group_param_ids();
  return std::find(copies.begin(), copies.end(), id) != copies.end();
}

// Whether this rank writes the pieces of parameter `id`: one copy of every piece in the job.
bool writes(const ParallelState& ps, const GPTModel& model, int id) {
  const ParamSpec& s = model.params().spec(id);
  // An expert under expert parallelism is held by one EP rank of each expert-DP group (its
  // unsplit tensors by expert-TP rank 0 of those).
  if (s.expert_parallel) return ps.coords().edp == 0 && (s.split_dim >= 0 || ps.coords().etp == 0);
  if (ps.coords().dp != 0 || ps.coords().cp != 0) return false;
  if (s.split_dim < 0 && model.partition().tp_rank() != 0) return false;  // TP replicas
  return !is_embedding_copy(model, id);
}

// Whether this rank writes optimizer state for its owned segments of parameter `id`: without
// sharding exactly as the parameter; with the distributed optimizer every data-parallel rank of
// the first instance (--num-distributed-optimizer-instances: the others hold copies) writes the
// segments it owns (minus TP replicas and the tied embedding's second copy).
bool writes_state(const Engine& engine, const GPTModel& model, int id, bool sharded) {
  const ParallelState& ps = engine.ps;
  if (!sharded) return writes(ps, model, id);
  if (engine.distopt_instances.instance_id() != 0) return false;
  for (const auto& z : engine.zero3)
    if (z->optimizer_state_copy()) return false;  // FSDP2's HSDP: the first replica writes the shards
  const ParamSpec& s = model.params().spec(id);
  // Replicas over TP; for expert-parallel experts over expert-TP (with expert TP 1 the TP ranks
  // hold different experts).
  const int64_t tp_rank = s.expert_parallel ? ps.coords().etp : model.partition().tp_rank();
  if (s.split_dim < 0 && tp_rank != 0) return false;
  return !is_embedding_copy(model, id);
}

// The state tensors' slice for `box` of segment `seg` (a view: no copy).
Tensor state_view(const Tensor& flat, const Optimizer::Segment& seg, const ParamSpec& s, const ParamBox& box) {
  const int64_t local_first = seg.begin - s.offset;
  return Tensor::from_blob(flat.data<float>() + seg.state_offset + (box.local_begin - local_first), box.shape,
                           DType::kF32);
}

Tensor rows_of(const Tensor& t, int64_t first, int64_t n) { return n == t.size(0) ? t : t.slice(first, n); }

// The training flags, plus every model flag (checkpoint_args.h) so the checkpoint alone rebuilds its model.
nlohmann::json args_section(const Arguments& a) {
  const TrainingArgs& t = a.training;
  nlohmann::json j = model_flags_json(a.model);
  add_moe_flags_json(a.moe, &j);
  j.update(nlohmann::json{{"micro_batch_size", t.micro_batch_size},
          {"global_batch_size", t.global_batch_size},
          {"seq_length", a.model.seq_length},
          {"train_iters", t.train_iters},
          {"train_samples", t.train_samples},
          {"seed", t.seed},
          {"lr", t.lr},
          {"min_lr", t.min_lr},
          {"optimizer", t.optimizer},
          {"tensor_model_parallel_size", a.parallel.tensor_model_parallel_size},
          {"pipeline_model_parallel_size", a.parallel.pipeline_model_parallel_size},
          {"expert_model_parallel_size", a.parallel.expert_model_parallel_size},
          {"data_parallel_size", a.parallel.data_parallel_size},
          {"attention_dropout", a.model.attention_dropout},
          {"hidden_dropout", a.model.hidden_dropout}});
  // What --use-checkpoint-args takes of the tokenizer (recorded when given).
  if (!a.tokenizer.tokenizer_type.empty()) j["tokenizer_type"] = a.tokenizer.tokenizer_type;
  if (!a.tokenizer.tokenizer_model.empty()) j["tokenizer_model"] = a.tokenizer.tokenizer_model;
  if (a.lora.enabled())
    j.update(nlohmann::json{{"lora_r", a.lora.lora_r},
                            {"lora_alpha", a.lora.lora_alpha},
                            {"lora_target_modules", a.lora.lora_target_modules},
                            {"lora_modules_to_save", a.lora.lora_modules_to_save}});
  return j;
}

std::string optimizer_tensor_name(const std::string& state, const std::string& param) {
  return "optimizer." + state + "." + param;
}

}  // namespace

void AsyncCheckpointSaves::schedule(std::unique_ptr<CheckpointWriter> writer, std::string saved_line) {
  GALE_CHECK(writer_ == nullptr) << "an asynchronous checkpoint save is already in flight";
  writer_ = std::move(writer);
  saved_line_ = std::move(saved_line);
}

Status AsyncCheckpointSaves::maybe_finalize(bool blocking) {
  if (empty()) return Status::Ok();
  if (blocking) {
    print_rank0("Unfinalized async checkpoint saves. Finalizing them synchronously now.");
  } else {
    // Every rank must agree before the commit's collectives: finished only when all writers are.
    int64_t done = writer_->shard_written() ? 1 : 0;
    std::vector<int64_t> all(static_cast<size_t>(world_.size()));
    world_.all_gather(&done, all.data(), 1, DType::kI64);
    if (std::find(all.begin(), all.end(), 0) != all.end()) return Status::Ok();
  }
  std::unique_ptr<CheckpointWriter> writer = std::move(writer_);
  GALE_RETURN_IF_ERROR(writer->finish_commit());
  print_rank0(saved_line_);
  return Status::Ok();
}

namespace {

// Adds this rank's pieces to `w`: with `all_held` everything it holds (a local checkpoint of
// --non-persistent-local-ckpt-algo atomic, read back by this rank alone), otherwise the pieces
// Gale's format assigns to it (one copy of every piece in the job).
Status add_pieces(const Arguments& args, const Engine& engine, CheckpointWriter& w, bool all_held) {
  const Optimizer& optimizer = *engine.optimizer;
  const CheckpointArgs& ca = args.checkpoint;
  for (size_t c = 0; c < engine.chunks.size(); ++c) {
    const GPTModel& model = *engine.chunks[c];
    const ParamBuffer& pb = model.params();
    for (int id = 0; id < pb.size(); ++id) {
      if (!all_held && !writes(engine.ps, model, id)) continue;
      const ParamSpec& s = pb.spec(id);
      if (!s.trainable && !s.buffer) continue;  // LoRA: the checkpoint holds the adapters, not the frozen base
      Tensor param = pb.param_values(id);  // f32 (reconstructed under --reuse-fp32-param)
      for (const Piece& piece : pieces_of(s))
        GALE_RETURN_IF_ERROR(
            w.add(s.whole_model_name(), s.global_shape, piece.offsets, rows_of(param, piece.first_row, piece.rows)));
    }
    if (!ca.save_optim) continue;
    // Optimizer state by global parameter name and shape, like the parameters, so it reshards:
    // each rank writes the boxes of the global tensors that its owned segments cover.
    const auto opt_state = optimizer.state(c);
    for (const Optimizer::Segment& seg : optimizer.segments(c)) {
      if (!all_held && !writes_state(engine, model, seg.param_id, optimizer.sharded(c))) continue;
      const ParamSpec& s = pb.spec(seg.param_id);
      for (const ParamBox& box : local_range_boxes(s, seg.begin - s.offset, seg.begin - s.offset + seg.numel))
        for (const auto& [state_name, flat] : opt_state)
          if (optimizer.holds_state(c, seg.param_id, state_name))
            GALE_RETURN_IF_ERROR(w.add(optimizer_tensor_name(state_name, s.whole_model_name()), s.global_shape, box.global_offsets,
                                     state_view(flat, seg, s, box)));
    }
  }
  // --quant-states: this rank's codes and scales as they are (train/quant_state_checkpoint.h).
  if (ca.save_optim) GALE_RETURN_IF_ERROR(add_quantised_state(w, optimizer, engine.ps.world()->rank()));
  return Status::Ok();
}

// metadata.json's trainer sections (model, args, trainer, optimizer, scheduler, RNG).
nlohmann::json checkpoint_sections(const Arguments& args, const Engine& engine, const TrainerState& state) {
  const Optimizer& optimizer = *engine.optimizer;
  const LrScheduler& scheduler = *engine.scheduler;
  const CheckpointArgs& ca = args.checkpoint;
  const GPTModel& model = *engine.chunks.front();
  nlohmann::json sections;
  sections["gale_trainer_state_version"] = kTrainerStateVersion;
  sections["model"] = checkpoint_model_section(model.config());
  sections["args"] = args_section(args);
  sections["trainer"] = {{"iteration", state.iteration},
                         {"consumed_train_samples", state.consumed_train_samples},
                         {"skipped_train_samples", state.skipped_train_samples},
                         {"consumed_valid_samples", state.consumed_valid_samples},
                         {"num_floating_point_operations_so_far", state.floating_point_operations_so_far}};
  // --rerun-mode validate_results: the rerun this checkpoint was saved for (train/rerun_state_machine.h).
  if (!state.rerun_state_machine.is_null()) sections["rerun_state_machine"] = state.rerun_state_machine;
  if (ca.save_optim) {
    const LrSchedule& ls = scheduler.schedule();
    sections["optimizer"] = {{"type", optimizer.config().type},
                             {"steps_taken", optimizer.steps_taken()},
                             {"use_distributed_optimizer", args.parallel.use_distributed_optimizer}};
    // --quant-states' mode, or the precision-aware optimizer's moment dtypes (Optimizer::state_format).
    if (optimizer.quantised()) sections["optimizer"]["quant_states"] = optimizer.state_format();
    // --optimizer-selection fused_ema_adamw: the EMA is in the tensors (optimizer.ema_params.<name>).
    if (optimizer.config().ema) sections["optimizer"]["ema_decay"] = optimizer.config().ema_decay;
    if (engine.grad_scaler) {  // --fp16: Megatron keeps the scaler in the optimizer's state
      const GradScalerState& g = engine.grad_scaler->state();
      sections["optimizer"]["grad_scaler"] = {{"scale", g.scale},
                                              {"growth_tracker", g.growth_tracker},
                                              {"hysteresis_tracker", g.hysteresis_tracker}};
    }
    sections["opt_param_scheduler"] = {{"max_lr", ls.max_lr},
                                       {"min_lr", ls.min_lr},
                                       {"lr_warmup_steps", ls.warmup_steps},
                                       {"lr_decay_steps", ls.decay_steps},
                                       {"lr_decay_style", ls.decay_style},
                                       {"num_steps", scheduler.num_steps()},
                                       {"start_wd", ls.start_wd},
                                       {"end_wd", ls.end_wd},
                                       {"wd_incr_style", ls.wd_incr_style},
                                       {"wd_incr_steps", ls.wd_incr_steps}};
  }
  if (ca.save_rng) sections["rng_state"] = {{"seed", args.training.seed}, {"generator", "philox4x32-10 counter-based"}};
  return sections;
}

std::string iteration_field(int64_t iteration) {
  char line[64];
  std::snprintf(line, sizeof line, "%7lld", static_cast<long long>(iteration));
  return line;
}

// The save itself, to `save_dir` (--save, or the global non-persistent directory).
Status save_to(const std::string& save_dir, const Arguments& args, const Engine& engine, const TrainerState& state,
               AsyncCheckpointSaves* async) {
  if (async && !async->empty()) {
    print_rank0("WARNING: Starting a checkpoint save before previous has finished. Consider increasing the "
                "checkpoint interval.");
    GALE_RETURN_IF_ERROR(async->maybe_finalize(/*blocking=*/true));
  }
  const std::string line = iteration_field(state.iteration);
  print_rank0(str_cat("saving checkpoint at iteration ", line, " to ", save_dir));
  if (args.training.freeze_all_layers) {  // Megatron's skip_weight_ckpt: no weights, no tracker
    print_rank0("  --freeze-all-layers: nothing was trained, so no checkpoint is written (the weights are the "
                "loaded ones)");
    return Status::Ok();
  }
  finish_param_sync(engine);  // the distributed optimizer's last all-gather may still be pending
  const GatheredParams gathered(engine, /*write_back=*/false);  // ZeRO-3: every unit whole while writing
  auto writer = std::make_unique<CheckpointWriter>(save_dir, state.iteration, *engine.ps.world());
  CheckpointWriter& w = *writer;
  GALE_RETURN_IF_ERROR(add_pieces(args, engine, w, /*all_held=*/false));
  const nlohmann::json sections = checkpoint_sections(args, engine, state);
  std::string saved = str_cat("  successfully saved checkpoint at iteration ", line, " to ", save_dir);
  if (async) {
    GALE_RETURN_IF_ERROR(w.start_commit(sections));  // the snapshot; training may change the tensors now
    async->schedule(std::move(writer), std::move(saved));
    print_rank0(str_cat("  scheduled an async checkpoint save at iteration ", line, " to ", save_dir));
    return Status::Ok();
  }
  GALE_RETURN_IF_ERROR(w.commit(sections));
  print_rank0(saved);
  return Status::Ok();
}

// Megatron's cleanup_old_non_persistent_checkpoint(leave_ckpt_num=1), before a global
// non-persistent save: every iter_<N> directory of `dir` but the newest is removed (rank 0 only),
// so the job always keeps the last complete one until the new save is committed.
void cleanup_old_non_persistent_checkpoints(const std::string& dir, Communicator& world) {
  if (world.rank() != 0) return;
  static const std::regex kIterDir(R"(iter_(\d+))");
  std::vector<std::pair<int64_t, std::string>> found;
  std::error_code ec;
  for (const std::filesystem::directory_entry& e : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (e.is_directory(ec) && std::regex_match(name, m, kIterDir)) found.emplace_back(std::stoll(m[1].str()), e.path().string());
  }
  if (found.empty()) return;
  std::sort(found.begin(), found.end());
  auto list = [](auto begin, auto end) {
    std::string text = "[";
    for (auto it = begin; it != end; ++it) text += str_cat(it == begin ? "" : ", ", "'", it->second, "'");
    return text + "]";
  };
  print_rank0(str_cat("Non-persistent checkpoints scheduled for removal: ", list(found.begin(), found.end() - 1)));
  print_rank0(str_cat("Non-persistent checkpoints to be kept: ", list(found.end() - 1, found.end())));
  for (auto it = found.begin(); it + 1 != found.end(); ++it) std::filesystem::remove_all(it->second, ec);
}

LocalCheckpointConfig local_config(const CheckpointArgs& ca) {
  LocalCheckpointConfig c;
  c.root = ca.non_persistent_local_ckpt_dir;
  c.algo = ca.non_persistent_local_ckpt_algo;
  c.replication = ca.replication;
  c.jump = ca.replication ? static_cast<int>(ca.replication_jump) : 1;
  c.factor = static_cast<int>(ca.replication_factor);
  return c;
}

}  // namespace

std::string non_persistent_global_dir(const CheckpointArgs& ca, const std::string& base) {
  if (!ca.non_persistent_global_ckpt_dir.empty()) return ca.non_persistent_global_ckpt_dir;
  return base.empty() ? std::string() : base + "/" + kNonPersistentSubdir;
}

Status save_checkpoint(const Arguments& args, const Engine& engine, const TrainerState& state,
                       AsyncCheckpointSaves* async) {
  return save_to(args.checkpoint.save, args, engine, state, async);
}

Status save_non_persistent_checkpoint(const Arguments& args, const Engine& engine, const TrainerState& state,
                                      AsyncCheckpointSaves* async) {
  const CheckpointArgs& ca = args.checkpoint;
  if (ca.non_persistent_ckpt_type == "global") {
    const std::string dir = non_persistent_global_dir(ca, ca.save);
    if (async && !async->empty()) {  // the save in flight must be complete before older ones go
      print_rank0("WARNING: Starting a checkpoint save before previous has finished. Consider increasing the "
                  "checkpoint interval.");
      GALE_RETURN_IF_ERROR(async->maybe_finalize(/*blocking=*/true));
    }
    cleanup_old_non_persistent_checkpoints(dir, *engine.ps.world());
    return save_to(dir, args, engine, state, async);
  }
  if (ca.non_persistent_ckpt_type != "local")
    return InvalidArgument("Please use local or global non-persistent checkpoints (got: ",
                           ca.non_persistent_ckpt_type.empty() ? std::string("None") : ca.non_persistent_ckpt_type, ")");
  // Local: synchronous (a save in flight is finalised first); each rank writes its part.
  if (async && !async->empty()) GALE_RETURN_IF_ERROR(async->maybe_finalize(/*blocking=*/true));
  const std::string line = iteration_field(state.iteration);
  print_rank0(str_cat("saving checkpoint at iteration ", line, " to ", ca.non_persistent_local_ckpt_dir));
  if (args.training.freeze_all_layers) {  // as save_to: a frozen run writes no weights
    print_rank0("  --freeze-all-layers: nothing was trained, so no checkpoint is written (the weights are the "
                "loaded ones)");
    return Status::Ok();
  }
  finish_param_sync(engine);
  const GatheredParams gathered(engine, /*write_back=*/false);
  CheckpointWriter w(ca.non_persistent_local_ckpt_dir, state.iteration, *engine.ps.world());
  GALE_RETURN_IF_ERROR(add_pieces(args, engine, w, /*all_held=*/ca.non_persistent_local_ckpt_algo == "atomic"));
  LocalCheckpointManager local(local_config(ca), *engine.ps.world());
  GALE_RETURN_IF_ERROR(local.save(w, state.iteration, checkpoint_sections(args, engine, state)));
  print_rank0(str_cat("  successfully saved local checkpoint from iteration ", line));
  return Status::Ok();
}

namespace {

// Which parameters a load reads: all of them, the base model's under LoRA (every parameter but
// the adapters: the frozen ones and the --lora-modules-to-save modules, which start from the base)
// or only the trainable ones (the LoRA adapters and the modules to save).
// kUpcycle: every parameter, read from a dense checkpoint under its upcycling source name.
enum class ParamSet { kAll, kBase, kTrainable, kUpcycle };

bool in_set(const ParamSpec& s, ParamSet set) {
  switch (set) {
    case ParamSet::kAll:
    case ParamSet::kUpcycle: return true;
    case ParamSet::kBase: return !is_lora_adapter(s.name);
    case ParamSet::kTrainable: return s.trainable;
  }
  return false;
}

// Megatron's checkpoint_exists: `dir` is given and has a tracker file.
bool checkpoint_exists(const std::string& dir) {
  return !dir.empty() && std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt");
}

// Megatron's OptimizerParamScheduler.load_state_dict: each saved schedule value `sd` against the
// flags' (in `schedule`). --override-opt_param-scheduler keeps the flags', --use-checkpoint-
// opt_param-scheduler takes the checkpoint's. With neither, Megatron stops at the first difference;
// Gale keeps the flags' and warns.
void restore_schedule(const nlohmann::json& sd, const CheckpointArgs& ca, LrSchedule& schedule) {
  auto check_and_set = [&](auto& value, const char* key, const char* name) {
    using T = std::decay_t<decltype(value)>;
    if (!sd.contains(key)) return;
    const T saved = sd.at(key).get<T>();
    if (ca.override_opt_param_scheduler) {
      print_rank0(str_cat(" > overriding ", name, " value to ", value));
    } else if (ca.use_checkpoint_opt_param_scheduler) {
      print_rank0(str_cat(" > using checkpoint value ", saved, " for ", name));
      value = saved;
    } else if (saved != value) {
      warn_rank0(str_cat("the checkpoint's ", name, " is ", saved, ", this run's ", value,
                         ": using this run's (Megatron stops here unless --override-opt_param-scheduler or "
                         "--use-checkpoint-opt_param-scheduler is given)"));
    }
  };
  check_and_set(schedule.max_lr, "max_lr", "learning rate");
  check_and_set(schedule.min_lr, "min_lr", "minimum learning rate");
  check_and_set(schedule.warmup_steps, "lr_warmup_steps", "warmup iterations");
  check_and_set(schedule.decay_steps, "lr_decay_steps", "total number of iterations");
  check_and_set(schedule.decay_style, "lr_decay_style", "learning rate decay style");
  check_and_set(schedule.start_wd, "start_wd", "start weight decay");
  check_and_set(schedule.end_wd, "end_wd", "end weight decay");
  check_and_set(schedule.wd_incr_steps, "wd_incr_steps", "total number of weight decay iterations");
  check_and_set(schedule.wd_incr_style, "wd_incr_style", "weight decay incr style");
}

// Loads the checkpoint in `dir` (`flag` names it in messages; iteration `step`, or the tracker's when
// kUnset): the parameters of `set`, the optimizer state and scheduler when `load_optim`, the trainer
// state when `load_trainer`.
Status load_from(const std::string& flag, const std::string& dir, int64_t step, const Arguments& args,
                 Engine& engine, TrainerState& state, ParamSet set, bool load_optim, bool load_trainer, bool* loaded,
                 const std::string& shown_dir = "") {
  const std::string& shown = shown_dir.empty() ? dir : shown_dir;  // the directory named in the log lines
  Optimizer& optimizer = *engine.optimizer;
  LrScheduler& scheduler = *engine.scheduler;
  const CheckpointArgs& ca = args.checkpoint;
  *loaded = false;
  const std::string tracker = dir + "/latest_checkpointed_iteration.txt";
  if (step == kUnset && !std::filesystem::exists(tracker)) {
    if (ca.exit_on_missing_checkpoint)
      return NotFound(flag, " ", dir, ": no checkpoint (", tracker, " does not exist) and --exit-on-missing-checkpoint");
    warn_rank0(str_cat("could not find the metadata file ", tracker,
                       "; will not load any checkpoints and will start from random"));
    return Status::Ok();
  }
  StatusOr<CheckpointReader> opened =
      step == kUnset ? CheckpointReader::open(dir) : CheckpointReader::open_iteration(dir, step);
  if (!opened.ok() && step != kUnset)
    return NotFound("--ckpt-step ", step, ": ", flag, " ", dir, " has no checkpoint of that iteration (",
                    opened.status().message(), ")");
  GALE_ASSIGN_OR_RETURN(CheckpointReader r, std::move(opened));
  print_rank0(str_cat(" loading checkpoint from ", shown, " at iteration ", r.iteration()));
  // The model shape must match: compare the saved configuration first, for a one-line error.
  GALE_ASSIGN_OR_RETURN(nlohmann::json saved_model, r.section("model"));
  nlohmann::json current = checkpoint_model_section(engine.chunks.front()->config());
  UpcyclingPlan upcycling;
  if (set == ParamSet::kUpcycle) {  // the dense model: FFN --ffn-hidden-size x --moe-upcycling-granularity
    GALE_ASSIGN_OR_RETURN(upcycling, make_upcycling_plan(args));
    if (saved_model.value("ffn_hidden_size", nlohmann::json()) != nlohmann::json(upcycling.dense_ffn))
      return FailedPrecondition("--moe-use-upcycling: checkpoint ", r.directory(), " was saved with ffn_hidden_size = ",
                                saved_model.value("ffn_hidden_size", nlohmann::json()).dump(),
                                "; expected the dense model's --ffn-hidden-size ", args.model.ffn_hidden_size,
                                " x --moe-upcycling-granularity ", args.moe.moe_upcycling_granularity, " = ",
                                upcycling.dense_ffn);
    current["ffn_hidden_size"] = upcycling.dense_ffn;
  }
  for (const auto& [key, value] : current.items()) {
    if (!saved_model.contains(key) || saved_model[key] != value)
      return FailedPrecondition("checkpoint ", r.directory(), " does not match this model: it was saved with ", key,
                                " = ", saved_model.contains(key) ? saved_model[key].dump() : "(absent)",
                                ", this run has ", value.dump());
  }
  for (const auto& [key, value] : saved_model.items())  // flags recorded only when set (openai_gelu)
    if (!current.contains(key))
      return FailedPrecondition("checkpoint ", r.directory(), " does not match this model: it was saved with ", key,
                                " = ", value.dump(), ", this run has (absent)");
  if (set == ParamSet::kUpcycle) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json saved_args, r.section("args"));
    if (saved_args.contains("num_experts") && !saved_args["num_experts"].is_null())
      return FailedPrecondition("--moe-use-upcycling: checkpoint ", r.directory(), " is a MoE model (num_experts = ",
                                saved_args["num_experts"].dump(), "); expected a dense one");
  }
  if (load_optim && !r.metadata().contains("optimizer"))
    return FailedPrecondition("checkpoint ", r.directory(),
                              " holds no optimizer state (saved with --no-save-optim, or written by gale convert): "
                              "load it with --finetune or --no-load-optim");
  // Another optimizer's state has other tensor names: say so before looking for them.
  if (load_optim) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json o, r.section("optimizer"));
    if (o.at("type").get<std::string>() != optimizer.config().type)
      return FailedPrecondition("checkpoint ", r.directory(), " holds ", o.at("type").get<std::string>(),
                                " optimizer state; this run uses --optimizer ", optimizer.config().type,
                                " (use --no-load-optim to start the optimizer afresh)");
    if (optimizer.config().ema && !o.contains("ema_decay"))
      return FailedPrecondition("checkpoint ", r.directory(), " holds no parameter EMA (saved without "
                                "--optimizer-selection fused_ema_adamw); this run uses fused_ema_adamw (use "
                                "--no-load-optim to start the optimizer, and the EMA, from the loaded parameters)");
  }
  finish_param_sync(engine);  // nothing may still write into the parameters being loaded
  const GatheredParams gathered(engine, /*write_back=*/true);  // ZeRO-3: loaded whole, each rank keeps its shard
  for (size_t c = 0; c < engine.chunks.size(); ++c) {
    ParamBuffer& pb = engine.chunks[c]->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      if (!in_set(s, set)) continue;
      if (set == ParamSet::kUpcycle) {  // each piece from its slice of the dense tensor (train/moe_upcycling.h)
        if (s.fp8_state_buffer && !r.has_tensor(s.whole_model_name())) continue;
        Tensor param = pb.param_values(id);
        for (const Piece& piece : pieces_of(s))
          for (const UpcyclingSource& src : upcycling_sources(upcycling, s, piece.offsets, piece.rows)) {
            if (src.name.empty()) continue;
            Tensor dst = rows_of(param, piece.first_row + src.first_row, src.rows);
            GALE_RETURN_IF_ERROR(r.read_slice_into(src.name, src.global_shape, src.offsets, dst));
            if (src.scale != 1.0f)
              for (float* v = dst.data<float>(); v != dst.data<float>() + dst.numel(); ++v) *v *= src.scale;
          }
        if (is_router_weight(s.whole_model_name())) upcycle_router_rows(upcycling, param);
        if (pb.is_split(id)) pb.set_param_values(id, param.data<float>());
        continue;
      }
      const std::string& source = s.whole_model_name();
      // --fp8-recipe delayed's state from a checkpoint saved without it: the initial state stands.
      if (s.fp8_state_buffer && !r.has_tensor(source)) continue;
      Tensor param = pb.param_values(id);  // a copy under --reuse-fp32-param: stored split below
      for (const Piece& piece : pieces_of(s)) {
        Tensor dst = rows_of(param, piece.first_row, piece.rows);
        GALE_RETURN_IF_ERROR(r.read_slice_into(source, s.global_shape, piece.offsets, dst));
      }
      if (pb.is_split(id)) pb.set_param_values(id, param.data<float>());
    }
    if (!load_optim) continue;
    // Whatever layout saved it, each owned segment reads the boxes it covers.
    auto opt_state = optimizer.state(c);
    for (const Optimizer::Segment& seg : optimizer.segments(c)) {
      const ParamSpec& s = pb.spec(seg.param_id);
      for (const ParamBox& box : local_range_boxes(s, seg.begin - s.offset, seg.begin - s.offset + seg.numel))
        for (auto& [state_name, flat] : opt_state) {
          if (!optimizer.holds_state(c, seg.param_id, state_name)) continue;
          Tensor dst = state_view(flat, seg, s, box);
          GALE_RETURN_IF_ERROR(
              r.read_slice_into(optimizer_tensor_name(state_name, s.whole_model_name()), s.global_shape, box.global_offsets, dst));
        }
    }
    GALE_RETURN_IF_ERROR(optimizer.store_state(c, opt_state));  // --swap-optimizer: back into its file
  }
  if (!load_trainer) {
    state = TrainerState{};
  } else {
    GALE_ASSIGN_OR_RETURN(nlohmann::json t, r.section("trainer"));
    if (!args.data.phase_transitions.empty()) {  // Megatron's check_checkpoint_args: _compare('global_batch_size')
      GALE_ASSIGN_OR_RETURN(nlohmann::json saved_args, r.section("args"));
      const int64_t saved = saved_args.value("global_batch_size", int64_t{-1});
      if (saved != args.training.global_batch_size)
        return FailedPrecondition("--phase-transition-iterations: global_batch_size value from checkpoint (", saved,
                                  ") is not equal to the input argument value (", args.training.global_batch_size,
                                  ") (checkpoint ", r.directory(), "; the phases need a fixed global batch size)");
    }
    state.iteration = t.at("iteration").get<int64_t>();
    state.consumed_train_samples = t.at("consumed_train_samples").get<int64_t>();
    state.skipped_train_samples = t.value("skipped_train_samples", int64_t{0});  // older checkpoints: none
    state.consumed_valid_samples = t.at("consumed_valid_samples").get<int64_t>();
    state.floating_point_operations_so_far = t.at("num_floating_point_operations_so_far").get<double>();
    state.rerun_state_machine = nullptr;
    if (r.metadata().contains("rerun_state_machine")) state.rerun_state_machine = r.metadata()["rerun_state_machine"];
  }
  if (load_optim) {
    GALE_ASSIGN_OR_RETURN(nlohmann::json o, r.section("optimizer"));
    optimizer.set_steps_taken(o.at("steps_taken").get<int64_t>());
    // --quant-states (or the precision-aware optimizer's fp16/fp8 moments): the saved codes and
    // scales when they fit this rank, else the f32 values quantised again above.
    const std::string saved_quant = o.value("quant_states", std::string());
    GALE_ASSIGN_OR_RETURN(bool exact, load_quantised_state(r, saved_quant, optimizer, engine.ps.world()->rank()));
    if (optimizer.quantised() && !exact)
      print_rank0(str_cat("  checkpoint ", r.directory(), ": optimizer state quantised again from its f32 values (",
                          saved_quant.empty()                       ? std::string("saved with f32 moments")
                          : saved_quant != optimizer.state_format() ? "saved with moments " + saved_quant
                                                                    : std::string("saved at another layout"),
                          "): the run continues, not bit for bit"));
    if (engine.grad_scaler && o.contains("grad_scaler")) {
      const nlohmann::json& g = o.at("grad_scaler");
      engine.grad_scaler->set_state(GradScalerState{g.at("scale").get<float>(), g.at("growth_tracker").get<int64_t>(),
                                                    g.at("hysteresis_tracker").get<int64_t>()});
    } else if (engine.grad_scaler) {
      print_rank0(str_cat("  checkpoint ", r.directory(), " has no loss-scaler state (not an --fp16 run): the loss "
                          "scale starts afresh"));
    }
    GALE_ASSIGN_OR_RETURN(nlohmann::json sch, r.section("opt_param_scheduler"));
    LrSchedule schedule = scheduler.schedule();
    restore_schedule(sch, ca, schedule);
    scheduler.set_schedule(schedule);
    scheduler.set_num_steps(sch.at("num_steps").get<int64_t>());
  }
  // As Megatron: without the optimizer state the scheduler is not restored either (it restarts).
  for (auto& chunk : engine.chunks) chunk->params().refresh_gemm_copy();
  *loaded = true;
  print_rank0(str_cat("  successfully loaded checkpoint from ", shown, " at iteration ", state.iteration));
  return Status::Ok();
}

// The persistent checkpoint's iteration that a non-persistent one competes with (Megatron's
// _load_base_checkpoint): --ckpt-step, else the tracker of --load, else -1.
int64_t persistent_iteration(const CheckpointArgs& ca) {
  if (ca.ckpt_step != kUnset) return ca.ckpt_step;
  StatusOr<TrackerValue> t = read_tracker(ca.load);
  return t.ok() && !t->release ? t->iteration : -1;
}

// Megatron's _get_non_persistent_iteration and _load_non_persistent_base_checkpoint: `*tried` says
// whether the non-persistent checkpoint was chosen (then `*loaded` is its outcome).
Status load_non_persistent(const Arguments& args, Engine& engine, TrainerState& state, bool finetune, bool* loaded,
                           bool* tried) {
  const CheckpointArgs& ca = args.checkpoint;
  *tried = false;
  const int64_t persistent = persistent_iteration(ca);
  if (ca.non_persistent_ckpt_type == "global") {
    const std::string dir = non_persistent_global_dir(ca, ca.load);
    StatusOr<TrackerValue> t = read_tracker(dir);
    if (!t.ok()) {
      print_rank0(str_cat("WARNING: could not find the metadata file ", tracker_path(dir)));
      print_rank0("    will not load any non-persistent checkpoint");
      return Status::Ok();
    }
    if (t->release) return FailedPrecondition(tracker_path(dir), ": Non-persistent checkpoint can't be a release checkpoint");
    if (t->iteration < persistent) {
      print_rank0("WARNING: non-persistent checkpoints are older than persistent checkpoint");
      return Status::Ok();
    }
    print_rank0(str_cat("Loading from a non-persistent checkpoint (non-persistent iter ", t->iteration, ")"));
    *tried = true;
    return load_from("--non-persistent-global-ckpt-dir", dir, kUnset, args, engine, state, ParamSet::kAll,
                     !finetune && ca.load_optim, !finetune, loaded);
  }
  // Local: the ranks' parts, own or replicated (collective from here on).
  LocalCheckpointManager local(local_config(ca), *engine.ps.world());
  GALE_ASSIGN_OR_RETURN(LocalCheckpointSearch found, local.find_latest());
  if (found.latest < 0 && found.newest_seen >= 0 && found.newest_seen >= persistent)
    return NotFound("--non-persistent-ckpt-type local: the local checkpoint of iteration ", found.newest_seen, " in ",
                    ca.non_persistent_local_ckpt_dir, " is incomplete: ", found.missing_part,
                    " does not exist and no rank holds a replica of it (a lost node's directory?",
                    ca.replication ? "" : " --replication keeps copies on other ranks",
                    "); remove the local checkpoints to resume from ",
                    persistent >= 0 ? str_cat("the persistent checkpoint of iteration ", persistent) : std::string("scratch"));
  if (found.latest < 0) return Status::Ok();
  if (found.latest < persistent) {
    print_rank0("WARNING: non-persistent checkpoints are older than persistent checkpoint");
    return Status::Ok();
  }
  print_rank0(str_cat("Loading from a non-persistent checkpoint (non-persistent iter ", found.latest, ")"));
  *tried = true;
  const std::string into = str_cat(local.own_dir(), "/load.tmp-", ::getpid());
  Status st = local.assemble(found.latest, ca.non_persistent_local_ckpt_algo != "atomic", into);
  if (st.ok())
    st = load_from("--non-persistent-local-ckpt-dir", into, found.latest, args, engine, state, ParamSet::kAll,
                   !finetune && ca.load_optim, !finetune, loaded, ca.non_persistent_local_ckpt_dir);
  std::error_code ec;
  std::filesystem::remove_all(into, ec);
  return st;
}

// A Megatron-LM checkpoint (torch, torch_dist or torch_dcp format) in `dir`: its model weights (and, unless
// `finetune`, its iteration and consumed samples; unless --no-load-optim too, a torch_dist or torch checkpoint's
// optimizer state, step and scheduler), through a Gale checkpoint written to a private temporary
// directory of this process. Megatron's RNG state (torch's generators) has no Gale counterpart: not read.
// `set`: ParamSet::kBase for the frozen base of a LoRA run (then `finetune`: weights only).
Status load_megatron(const std::string& flag, const std::string& dir, const Arguments& args, Engine& engine,
                     TrainerState& state, bool finetune, bool* loaded, ParamSet set = ParamSet::kAll) {
  const CheckpointArgs& ca = args.checkpoint;
  const bool load_optim = !finetune && ca.load_optim;
  GALE_ASSIGN_OR_RETURN(MegatronCheckpoint m, read_megatron_checkpoint(dir, ca.ckpt_step, load_optim));
  GALE_RETURN_IF_ERROR(check_megatron_moe_run(m.moe, args.moe, m.directory));
  std::string what = "model weights only, Megatron's optimizer and RNG state are not read";
  if (m.optimizer) {
    const MegatronOptimizerState& o = *m.optimizer;
    std::string states;
    for (const auto& [name, t] : o.tensors) states += (states.empty() ? "" : ", ") + name;
    what = str_cat("model weights", o.fp32_masters ? " (its fp32 master copies)" : "",
                   ", ", o.type, " optimizer state (", o.layout, ": ", states.empty() ? std::string("none") : states,
                   "; step ", o.step, "), scheduler and iteration; Megatron's RNG state is not read");
  }
  print_rank0(str_cat(" reading Megatron's ", checkpoint_format_name(m.format), " checkpoint ", m.directory,
                      " (checkpoint_version ", m.checkpoint_version, ", saved at TP ", m.tensor_parallel, " x PP ",
                      m.pipeline_parallel, "): ", what));
  GALE_ASSIGN_OR_RETURN(TemporaryGaleCheckpoint copy, TemporaryGaleCheckpoint::write(m, dir));
  const std::string into = copy.dir();
  Status st = load_from(flag, into, kUnset, args, engine, state, set, load_optim, !finetune, loaded, dir);
  if (st.ok()) return st;
  std::string message = st.message();  // name the Megatron directory, not the temporary one
  for (size_t at; (at = message.find(into)) != std::string::npos;) message.replace(at, into.size(), dir);
  return Status(st.code(), message);
}

}  // namespace

namespace {

// --lora-load: the adapter checkpoint's modules to save (recorded in its args) are this run's, so
// the same parameters train on (checked here for a one-line error; a checkpoint without the
// record saved none).
Status check_lora_modules_to_save(const LoraArgs& l) {
  StatusOr<CheckpointReader> r = CheckpointReader::open(l.lora_load);
  if (!r.ok()) return Status::Ok();  // no checkpoint: load_from reports it
  GALE_ASSIGN_OR_RETURN(nlohmann::json saved_args, r.value().section("args"));
  std::vector<std::string> saved;
  if (saved_args.contains("lora_modules_to_save"))
    saved = saved_args["lora_modules_to_save"].get<std::vector<std::string>>();
  if (std::set<std::string>(saved.begin(), saved.end()) !=
      std::set<std::string>(l.lora_modules_to_save.begin(), l.lora_modules_to_save.end()))
    return InvalidArgument("--lora-modules-to-save ", nlohmann::json(l.lora_modules_to_save).dump(),
                           " does not match the modules saved in --lora-load ", l.lora_load, " (",
                           nlohmann::json(saved).dump(), ")");
  return Status::Ok();
}

// load_checkpoint before --override-ckpt-iteration.
Status load_checkpoint_as_saved(const Arguments& args, Engine& engine, TrainerState& state, bool* loaded) {
  const CheckpointArgs& ca = args.checkpoint;
  // Megatron's load_checkpoint: without a checkpoint in --load, --pretrained-checkpoint's is loaded
  // as with --finetune (weights only, iteration 0).
  std::string flag = "--load", dir = ca.load;
  bool finetune = ca.finetune;
  if (!ca.pretrained_checkpoint.empty() && !checkpoint_exists(ca.load)) {
    print_rank0(str_cat("Checkpoint file not found in load directory ", ca.load.empty() ? "(none)" : ca.load,
                        " attempting to finetune with checkpoint in ", ca.pretrained_checkpoint));
    if (!checkpoint_exists(ca.pretrained_checkpoint) && ca.ckpt_step == kUnset)
      return NotFound("--pretrained-checkpoint ", ca.pretrained_checkpoint, ": no checkpoint found in the load "
                      "directory or the pretrained directory (no latest_checkpointed_iteration.txt in either)");
    flag = "--pretrained-checkpoint";
    dir = ca.pretrained_checkpoint;
    finetune = true;
  }
  if (!args.lora.enabled()) {
    if (!ca.non_persistent_ckpt_type.empty() && flag == "--load") {
      bool tried = false;
      GALE_RETURN_IF_ERROR(load_non_persistent(args, engine, state, finetune, loaded, &tried));
      if (tried) return Status::Ok();
    }
    if (!dir.empty()) {  // Megatron's own checkpoint formats (--auto-detect-ckpt-format is always on)
      GALE_ASSIGN_OR_RETURN(CheckpointFormat format, detect_checkpoint_format(dir, ca.ckpt_step));
      if (format != CheckpointFormat::kGale && format != CheckpointFormat::kNone)
        return load_megatron(flag, dir, args, engine, state, finetune, loaded);
    }
    return load_from(flag, dir, ca.ckpt_step, args, engine, state, ParamSet::kAll, !finetune && ca.load_optim,
                     !finetune, loaded);
  }
  // LoRA: --load gives the base weights only (its optimizer and trainer state belong to other
  // parameters), from a Gale or a Megatron-LM checkpoint (MindSpeed-LLM's flow: HF -> Megatron,
  // then LoRA with --load); --lora-load gives the adapters (and the modules to save) and resumes
  // their training state.
  *loaded = false;
  if (!dir.empty()) {
    GALE_ASSIGN_OR_RETURN(CheckpointFormat format, detect_checkpoint_format(dir, ca.ckpt_step));
    if (format != CheckpointFormat::kGale && format != CheckpointFormat::kNone)
      GALE_RETURN_IF_ERROR(load_megatron(flag, dir, args, engine, state, /*finetune=*/true, loaded, ParamSet::kBase));
    else
      GALE_RETURN_IF_ERROR(
          load_from(flag, dir, ca.ckpt_step, args, engine, state, ParamSet::kBase, false, false, loaded));
  }
  if (args.lora.lora_load.empty()) return Status::Ok();
  GALE_RETURN_IF_ERROR(check_lora_modules_to_save(args.lora));
  bool lora_loaded = false;
  GALE_RETURN_IF_ERROR(load_from("--lora-load", args.lora.lora_load, kUnset, args, engine, state,
                                 ParamSet::kTrainable, ca.load_optim, true, &lora_loaded));
  *loaded = *loaded || lora_loaded;
  return Status::Ok();
}

}  // namespace

StatusOr<int64_t> frozen_resume_iteration(const std::string& save_dir) {
  if (save_dir.empty()) return int64_t{0};
  StatusOr<TrackerValue> tracker = read_tracker(save_dir);
  if (tracker.status().code() == StatusCode::kNotFound) return int64_t{0};
  if (!tracker.ok())
    return DataLoss("--freeze-all-layers reads this run's progress from --save ", save_dir, ": ",
                    tracker.status().message());
  return tracker->release ? int64_t{0} : tracker->iteration;
}

Status load_checkpoint(const Arguments& args, Engine& engine, TrainerState& state, bool* loaded) {
  GALE_RETURN_IF_ERROR(load_checkpoint_as_saved(args, engine, state, loaded));
  if (!*loaded) return Status::Ok();
  int64_t n = args.checkpoint.override_ckpt_iteration;
  if (n == kUnset && args.training.freeze_all_layers) {  // Megatron's read_frozen_resume_iteration(args.save)
    GALE_ASSIGN_OR_RETURN(const int64_t progress, frozen_resume_iteration(args.checkpoint.save));
    if (progress > 0) n = progress;
  }
  if (n == kUnset) return Status::Ok();
  // Megatron's --override-ckpt-iteration: the data loader replays from iteration n at this run's
  // global batch size; the optimizer and scheduler keep what was loaded.
  state.iteration = n;
  state.consumed_train_samples = n * args.training.global_batch_size;
  state.skipped_train_samples = 0;
  print_rank0(str_cat("--override-ckpt-iteration: start at iteration ", n, " (consumed_train_samples ",
                      state.consumed_train_samples, ")"));
  return Status::Ok();
}

StatusOr<int64_t> dpo_reference_iteration(const DpoArgs& dpo, const std::string& dir, std::string* note) {
  std::error_code ec;
  if (std::filesystem::exists(iteration_dir(dir, dpo.refer_model_iter), ec)) return dpo.refer_model_iter;
  if (!dpo.refer_model_iter_given) {
    *note = str_cat("the reference checkpoint directory ", dir, " has no iteration ", dpo.refer_model_iter,
                    " (--refer-model-iter's default): the reference loads its latest checkpoint");
    return int64_t{kUnset};
  }
  std::vector<std::string> found;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec))
    if (e.is_directory(ec) && e.path().filename().string().rfind("iter_", 0) == 0)
      found.push_back(e.path().filename().string());
  std::sort(found.begin(), found.end());
  std::string list;
  for (const std::string& f : found) list += (list.empty() ? "" : ", ") + f;
  return NotFound("--refer-model-iter ", dpo.refer_model_iter, ": the reference checkpoint directory ", dir, " has no ",
                  iteration_dir_name(dpo.refer_model_iter), " (found: ", list.empty() ? "none" : list, ")");
}

Status load_model_weights(const std::string& flag, const std::string& dir, const std::vector<GPTModel*>& models,
                          const std::string& what, int64_t iteration) {
  if (!std::filesystem::exists(dir + "/latest_checkpointed_iteration.txt"))
    return NotFound(flag, " ", dir, ": expected a checkpoint directory (with latest_checkpointed_iteration.txt)");
  StatusOr<CheckpointReader> opened =
      iteration == kUnset ? CheckpointReader::open(dir) : CheckpointReader::open_iteration(dir, iteration);
  if (!opened.ok()) return Status(opened.status().code(), str_cat(flag, " ", dir, ": ", opened.status().message()));
  CheckpointReader r = std::move(opened).value();
  GALE_ASSIGN_OR_RETURN(nlohmann::json saved_model, r.section("model"));
  GALE_CHECK(!models.empty()) << "no model chunks to load";
  const nlohmann::json current = checkpoint_model_section(models.front()->config());
  for (const auto& [key, value] : current.items())
    if (!saved_model.contains(key) || saved_model[key] != value)
      return FailedPrecondition(flag, " ", r.directory(), " does not match this model: it was saved with ", key, " = ",
                                saved_model.contains(key) ? saved_model[key].dump() : "(absent)", ", this run has ",
                                value.dump());
  for (GPTModel* model : models) {
    ParamBuffer& pb = model->params();
    for (int id = 0; id < pb.size(); ++id) {
      const ParamSpec& s = pb.spec(id);
      if (s.fp8_state_buffer && !r.has_tensor(s.whole_model_name())) continue;  // saved without FP8
      Tensor param = pb.param_values(id);  // a copy under --reuse-fp32-param: stored split below
      for (const Piece& piece : pieces_of(s)) {
        Tensor dst = rows_of(param, piece.first_row, piece.rows);
        GALE_RETURN_IF_ERROR(r.read_slice_into(s.whole_model_name(), s.global_shape, piece.offsets, dst));
      }
      if (pb.is_split(id)) pb.set_param_values(id, param.data<float>());
    }
    pb.refresh_gemm_copy();
  }
  print_rank0(str_cat("  loaded the ", what, " from ", r.directory(), " (", flag, ") at iteration ", r.iteration()));
  return Status::Ok();
}

Status upcycle_checkpoint(const Arguments& args, Engine& engine, TrainerState& state) {
  const CheckpointArgs& ca = args.checkpoint;
  if (checkpoint_exists(ca.save))
    return FailedPrecondition("--moe-use-upcycling: --save ", ca.save, ": The upcycling destination directory "
                              "already exists. Please check if --moe-use-upcycling is mistakenly enabled. Upcycling "
                              "should only be set for the first run when converting the dense model. All subsequent "
                              "runs should remove this flag.");
  if (!checkpoint_exists(ca.load) && ca.ckpt_step == kUnset)
    return NotFound("--moe-use-upcycling: --load ", ca.load, " holds no checkpoint (no latest_checkpointed_iteration.txt)");
  GALE_ASSIGN_OR_RETURN(const UpcyclingPlan plan, make_upcycling_plan(args));
  if (args.moe.moe_router_topk % plan.granularity != 0)
    warn_rank0(str_cat("--moe-use-upcycling with granularity ", plan.granularity, " and --moe-router-topk ",
                       args.moe.moe_router_topk, ": the top-k cannot take whole groups of ", plan.granularity,
                       " tied experts, so the upcycled model does not start as the dense one"));
  bool loaded = false;
  // The weights and the trainer state (iteration, consumed samples, FLOPs) of the dense run; no
  // optimizer state or RNG (Megatron turns both off for upcycling).
  GALE_RETURN_IF_ERROR(
      load_from("--load", ca.load, ca.ckpt_step, args, engine, state, ParamSet::kUpcycle, false, true, &loaded));
  Arguments model_only = args;
  model_only.checkpoint.save_optim = false;
  model_only.checkpoint.async_save = false;
  TrainerState saved = state;
  saved.iteration = 1;  // Megatron saves the upcycled model as iteration 1 ...
  GALE_RETURN_IF_ERROR(save_checkpoint(model_only, engine, saved));
  print_rank0(str_cat("Upcycled checkpoint saved to ", ca.save));
  state.iteration = 0;  // ... and trains it from iteration 0
  return Status::Ok();
}

}  // namespace gale
