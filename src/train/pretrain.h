// `gale pretrain`: the whole of Megatron's pretrain_gpt.py — flags, world, data, model,
// optimizer, checkpoint load, the training loop, and the final reports.
#pragma once

namespace gale {

// Returns the process exit code: 0 on success, 2 for a command-line error, 1 for a failure
// during the run (each with a one-line message on stderr), and Megatron's 16 (resume to
// disambiguate) or 17 (failed on result validation) from --rerun-mode validate_results.
int pretrain_main(int argc, char** argv);

}  // namespace gale
