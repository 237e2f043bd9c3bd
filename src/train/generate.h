// `gale generate`: text from a trained checkpoint (greedy, temperature, top-k and top-p sampling, beam search),
// with the model and tokenizer flags of `gale pretrain` and MindSpeed-LLM's inference flags.
#pragma once

namespace gale {

// Returns the process exit code (0, 2 for a command-line error, 1 for a failure).
int generate_main(int argc, char** argv);

}  // namespace gale
