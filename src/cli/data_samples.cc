// `gale data-samples`: the samples `gale pretrain` trains on, one JSON line each.
#include <cstdio>
#include <string>

#include "cli/subcommands.h"
#include "core/log.h"
#include "train/arg_parser.h"
#include "train/arguments.h"
#include "train/batch_size_rampup.h"
#include "train/data_setup.h"
#include "train/phase_transitions.h"

namespace gale::cli {

namespace {
int fail(const Status& s) {
  std::fprintf(stderr, "gale data-samples: %s\n", s.message().c_str());
  return s.code() == StatusCode::kInvalidArgument ? 2 : 1;
}
}  // namespace

int run_data_samples(int argc, char** argv) {
  ArgParser p("gale data-samples",
              "Print training samples as JSON lines {\"split\", \"index\", \"ids\"}: the S input ids then the last "
              "target id. Takes the data and training flags of `gale pretrain` and builds the same datasets.");
  Arguments a;
  add_all_pretrain_args(p, a);
  std::string split = "train";
  int64_t index = kUnset, count = 1, dp = 1;
  p.group("data-samples");
  p.add_choice("--sample-split", &split, {"train", "valid", "test"}, "which split to print");
  p.add("--sample-index", &index, "first sample index (the trainer's consumed-samples count)");
  p.add("--sample-count", &count, "number of consecutive samples to print");
  p.add("--data-parallel-size", &dp,
        "data-parallel size of the training run, used for the default --global-batch-size (micro-batch x DP)");
  Status s = p.parse(argc, argv);
  if (!s.ok()) return fail(s);
  if (p.help_requested()) {
    std::printf("%s", p.help_text().c_str());
    return 0;
  }
  set_log_identity(0, 1);
  TrainingArgs& t = a.training;
  if (index == kUnset) return fail(InvalidArgument("--sample-index is required"));
  if (index < 0) return fail(InvalidArgument("--sample-index: expected a non-negative integer, found ", index));
  if (count < 1) return fail(InvalidArgument("--sample-count: expected a positive integer, found ", count));
  if (dp < 1) return fail(InvalidArgument("--data-parallel-size: expected a positive integer, found ", dp));
  if (a.model.seq_length == kUnset) return fail(InvalidArgument("--seq-length is required"));
  if (t.micro_batch_size == kUnset && t.global_batch_size == kUnset)
    return fail(InvalidArgument("--micro-batch-size (or --global-batch-size) is required"));
  if (t.global_batch_size == kUnset) t.global_batch_size = t.micro_batch_size * dp;
  if (t.global_batch_size <= 0) return fail(InvalidArgument("--global-batch-size: expected a positive integer"));
  if (!t.rampup_batch_size.empty()) {  // sizes the train iterations, hence the validation split
    if (t.train_samples == kUnset)
      return fail(InvalidArgument("--rampup-batch-size needs sample-based training (--train-samples), not --train-iters"));
    if (t.micro_batch_size == kUnset) return fail(InvalidArgument("--rampup-batch-size needs --micro-batch-size"));
    a.parallel.data_parallel_size = dp;
    auto calculator = num_micro_batches_calculator_from_args(a);
    if (!calculator.ok()) return fail(calculator.status());
  }
  if ((t.train_iters == kUnset) == (t.train_samples == kUnset))
    return fail(InvalidArgument("give exactly one of --train-iters and --train-samples (they size the datasets)"));
  if (a.logging.eval_interval <= 0) return fail(InvalidArgument("--eval-interval: expected a positive integer"));
  if (a.logging.eval_iters < 0) return fail(InvalidArgument("--eval-iters: expected a non-negative integer"));
  s = validate_data_args(a, p);
  if (!s.ok()) return fail(s);
  // --phase-transition-iterations: --sample-index counts the consumed samples of the whole run; the
  // samples are those of its phase's own training dataset, read from the phase's first sample.
  int64_t phase_first_sample = 0;
  if (!a.data.phase_transition_iterations.empty()) {
    s = validate_phase_args(a, p);
    if (!s.ok()) return fail(s);
    if (split != "train")
      return fail(InvalidArgument("--phase-transition-iterations: phases change only the train split (found "
                                  "--sample-split ", split, ")"));
    a.data.phase_resume_iteration = index / t.global_batch_size;
    const PhaseSpan phase = phase_at(a.data.phase_transitions, a.data.phase_resume_iteration, t.global_batch_size,
                                     t.train_samples);
    if (index + count > phase.end_sample)
      return fail(OutOfRange("--sample-index ", index, " + --sample-count ", count, " crosses the phase transition at "
                             "sample ", phase.end_sample, " (--phase-transition-iterations ",
                             a.data.phase_transition_iterations, "): print each phase's samples separately"));
    phase_first_sample = phase.first_sample;
  }

  // Start-up lines go to stderr so that stdout holds only the samples.
  auto data = build_pretrain_data(a, [](const std::string& l) { std::fprintf(stderr, "%s\n", l.c_str()); });
  if (!data.ok()) return fail(data.status());
  const SampleDataset* ds = split == "train"   ? data->train.get()
                            : split == "valid" ? data->valid.get()
                                               : data->test.get();
  if (!ds) return fail(FailedPrecondition("the ", split, " split is empty for these flags"));
  if (index - phase_first_sample + count > ds->size())
    return fail(OutOfRange("--sample-index ", index, " + --sample-count ", count, " exceeds the ", split, " split's ",
                           ds->size(), " samples"));
  TrainingSample sample;
  std::string line;
  for (int64_t k = index; k < index + count; ++k) {
    s = ds->get(k - phase_first_sample, &sample);
    if (!s.ok()) return fail(s);
    line = "{\"split\": \"" + split + "\", \"index\": " + std::to_string(k) + ", \"ids\": [";
    for (size_t i = 0; i < sample.tokens.size(); ++i) {
      line += std::to_string(sample.tokens[i]);
      line += ", ";
    }
    line += std::to_string(sample.labels.back());
    line += "]}\n";
    std::fputs(line.c_str(), stdout);
  }
  return 0;
}

}  // namespace gale::cli
