// Validation of the data and tokenizer flags.
#include "train/arguments.h"

namespace gale {

Status validate_data_args(Arguments& a, const ArgParser& p) {
  DataArgs& d = a.data;
  bool per_split = !d.train_data_path.empty() || !d.valid_data_path.empty() || !d.test_data_path.empty();
  if (!d.data_path.empty() && per_split)
    return InvalidArgument("--data-path and --train-data-path/--valid-data-path/--test-data-path are exclusive");
  if (!d.mock_data && d.data_path.empty() && !per_split && d.data_args_path.empty() && d.per_split_data_args_path.empty())
    return InvalidArgument("no training data: give --data-path PREFIX (a .bin/.idx pair made by `gale preprocess`) or --mock-data");
  if (d.mock_data && (!d.data_path.empty() || per_split))
    return InvalidArgument("--mock-data and --data-path are exclusive");
  if (d.split.empty() && !d.data_path.empty()) d.split = "969, 30, 1";
  (void)p;
  return Status::Ok();
}

}  // namespace gale
