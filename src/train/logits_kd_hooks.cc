// Megatron main's offline distillation in the training loop: the teacher's saver and the student's
// cached-logits KD loss as head logits hooks (train/logits_kd_hooks.h).
#include "train/logits_kd_hooks.h"

#include <cstdlib>
#include <filesystem>

#include "core/log.h"
#include "model/topk_kl.h"
#include "parallel/mappings.h"
#include "train/arguments.h"
#include "train/data_paths.h"

namespace gale {

namespace {

// Megatron's get_blend_from_list: "w1 p1 w2 p2 ..." when the count is even and every other entry
// is a number, else prefixes of weight 1; as (weight, file stem) pairs (_blend_identifiers).
std::vector<std::pair<double, std::string>> blend_identifiers(const std::vector<std::string>& list) {
  auto stem = [](const std::string& p) { return std::filesystem::path(p).stem().string(); };
  bool weighted = list.size() >= 2 && list.size() % 2 == 0;
  for (size_t i = 0; weighted && i < list.size(); i += 2) {
    char* end = nullptr;
    std::strtod(list[i].c_str(), &end);
    weighted = end != list[i].c_str() && *end == '\0';
  }
  std::vector<std::pair<double, std::string>> out;
  for (size_t i = 0; i < list.size(); i += weighted ? 2 : 1)
    out.emplace_back(weighted ? std::strtod(list[i].c_str(), nullptr) : 1.0, stem(list[weighted ? i + 1 : i]));
  return out;
}

}  // namespace

StatusOr<LogitsDatasetIdentity> logits_dataset_identity(const Arguments& args) {
  const DataArgs& d = args.data;
  LogitsDatasetIdentity id;
  id.seed = args.training.seed;
  id.seq_length = args.model.seq_length;
  if (args.training.train_samples != kUnset)
    id.train_samples = args.training.train_samples;
  else if (args.training.train_iters != kUnset && args.training.global_batch_size != kUnset)
    id.train_samples = args.training.train_iters * args.training.global_batch_size;
  if (d.mock_data) return id;
  // Megatron's get_blend_and_blend_per_split: --data-path (or --data-args-path) first, else the
  // per-split flags, else mock.
  if (!d.data_path.empty() || !d.data_args_path.empty()) {
    GALE_ASSIGN_OR_RETURN(DataPathList list, data_path_list(d));
    id.blend = blend_identifiers(list.entries);
    return id;
  }
  if (!d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty() ||
      !d.per_split_data_args_path.empty()) {
    GALE_ASSIGN_OR_RETURN(auto lists, per_split_data_path_lists(d));
    id.per_split = true;
    id.blend = blend_identifiers(lists[0].entries);
  }
  return id;
}

// ---- the teacher ----

LogitsSaverHook::LogitsSaverHook(std::string dir, const LogitsSaverSettings& settings, const LogitsDatasetIdentity& id,
                                 int cp_rank, int dp_rank, Communicator* tp, IterationFn iteration)
    : dir_(std::move(dir)),
      meta_(cached_logits_meta_json(id, settings)),
      settings_(settings),
      cp_rank_(cp_rank),
      dp_rank_(dp_rank),
      tp_(tp),
      iteration_(std::move(iteration)) {}

HeadLogitsHook::Result LogitsSaverHook::training_logits(const MicroBatch& mb, const Tensor& logits,
                                                        const std::vector<float>&, int64_t) {
  Result r;
  if (!active()) return r;
  r.lm_coef = 0.0;
  r.report_lm_loss = false;
  const int64_t it = iteration_();
  if (current_ && *current_ != it && !has_error()) record_error(finish_iteration());
  current_ = it;
  // The whole vocabulary's logits (every TP rank takes part in the gather; rank 0 selects).
  const Tensor full = tp_ != nullptr && tp_->size() > 1 ? gather_from_tp_region(logits, *tp_) : logits;
  if (tp_ != nullptr && tp_->rank() != 0) return r;
  StatusOr<TopKLogProbs> sel = select_topk_logprobs(full.data<float>(), mb.S, mb.B, full.size(1), settings_.k,
                                                    settings_.p, settings_.min_k, settings_.dtype);
  if (!sel.ok()) {
    record_error(sel.status());
    return r;
  }
  microbatches_.push_back(std::move(sel).value());
  return r;
}

Status LogitsSaverHook::finish_iteration() {
  if (!current_ || microbatches_.empty()) return Status::Ok();
  GALE_ASSIGN_OR_RETURN(std::string member, encode_cached_logits_iteration(microbatches_, settings_.dtype));
  pending_.iterations.emplace_back(*current_, std::move(member));
  microbatches_.clear();
  return Status::Ok();
}

Status LogitsSaverHook::flush() {
  GALE_RETURN_IF_ERROR(take_error());
  GALE_RETURN_IF_ERROR(finish_iteration());
  current_.reset();
  if (pending_.iterations.empty()) return Status::Ok();
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  if (ec) return IOError("--logits-save-dir: cannot create '", dir_, "': ", ec.message());
  pending_.meta = meta_;
  const std::string name = cached_logits_tar_name(cp_rank_, dp_rank_, pending_.iterations.back().first);
  print_rank0(str_cat("  writing ", pending_.iterations.size(), " logit iterations to ", dir_, "/", name));
  GALE_RETURN_IF_ERROR(write_cached_logits_tar((std::filesystem::path(dir_) / name).string(), pending_));
  pending_ = CachedLogitsTar{};
  return Status::Ok();
}

// ---- the student ----

CachedLogitsKdHook::CachedLogitsKdHook(CachedLogitsReader reader, double alpha, bool ignore_errors, Communicator* tp,
                                       IterationFn iteration)
    : reader_(std::move(reader)), alpha_(alpha), ignore_errors_(ignore_errors), tp_(tp), iteration_(std::move(iteration)) {}

StatusOr<double> CachedLogitsKdHook::kd_loss(const MicroBatch& mb, const Tensor& logits,
                                             const std::vector<float>& mask_sb, int64_t vocab_offset, Tensor* grad) {
  const int64_t it = iteration_();
  if (!current_ || *current_ != it) {  // a new iteration: its micro-batches from the shards
    teacher_ = reader_.iteration(it);
    current_ = it;
    next_mb_ = 0;
  }
  const size_t m = next_mb_++;
  if (!teacher_.ok()) return teacher_.status();
  const std::vector<TopKLogProbs>& mbs = teacher_.value();
  if (m >= mbs.size())
    return OutOfRange("--logits-load-dir: micro-batch ", m, " of iteration ", it, " out of range: only ", mbs.size(),
                      " micro-batches were saved for it");
  const TopKLogProbs& t = mbs[m];
  if (t.S != mb.S || t.B != mb.B)
    return FailedPrecondition("--logits-load-dir: iteration ", it, " micro-batch ", m, ": the teacher saved [S, B] = [",
                              t.S, ", ", t.B, "], this run's micro-batch is [", mb.S, ", ", mb.B,
                              "] (--seq-length, --micro-batch-size and context parallelism must be the teacher's)");
  const int64_t T = mb.S * mb.B, Vl = logits.size(1);
  std::vector<float> coef(static_cast<size_t>(T));
  for (int64_t i = 0; i < T; ++i) coef[static_cast<size_t>(i)] = static_cast<float>(alpha_) * mask_sb[static_cast<size_t>(i)];
  std::vector<double> kl(static_cast<size_t>(T));
  *grad = Tensor::empty({T, Vl});
  KlAllReduce over_tp;
  if (tp_ != nullptr && tp_->size() > 1)
    over_tp = [this](double* data, int64_t n, bool max) {
      tp_->all_reduce(data, n, DType::kF64, max ? ReduceOp::kMax : ReduceOp::kSum);
    };
  const TeacherTopK teacher{t.logprobs.data(), t.indices.data(), t.K};
  topk_kl_forward_backward(logits.data<float>(), T, Vl, vocab_offset, teacher, coef.data(), kl.data(),
                           grad->data<float>(), tp_ == nullptr || tp_->rank() == 0, over_tp);
  double kd = 0.0;
  for (int64_t i = 0; i < T; ++i) kd += kl[static_cast<size_t>(i)] * mask_sb[static_cast<size_t>(i)];
  return kd;
}

HeadLogitsHook::Result CachedLogitsKdHook::training_logits(const MicroBatch& mb, const Tensor& logits,
                                                           const std::vector<float>& mask_sb, int64_t vocab_offset) {
  Result r;
  if (!active()) return r;
  Tensor grad;
  last_kd_ = kd_loss(mb, logits, mask_sb, vocab_offset, &grad);
  if (last_kd_.ok()) {
    r.lm_coef = 1.0 - alpha_;
    r.logit_grad = grad;
  } else if (!ignore_errors_) {
    record_error(last_kd_.status());  // the run stops after this iteration (Trainer)
  }
  return r;
}

void CachedLogitsKdHook::training_lm_loss(double loss_sum, double tokens) {
  if (!active()) return;
  const StatusOr<KdMicroBatchLoss> mixed = mix_kd_loss(loss_sum, last_kd_, alpha_, ignore_errors_);
  if (!mixed.ok() || !mixed.value().kd_used) return;  // an error (take_error) or the LM loss alone
  sums_.kd += mixed.value().kd;
  sums_.kd_tokens += tokens;
  sums_.total += mixed.value().total;
  sums_.total_tokens += tokens;
}

CachedLogitsKdHook::Sums CachedLogitsKdHook::take_sums() {
  const Sums s = sums_;
  sums_ = Sums{};
  return s;
}

}  // namespace gale
