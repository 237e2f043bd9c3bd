// --exit-signal-handler: SIGTERM recorded by a signal handler and acted on between iterations.
//
// Megatron's DistributedSignalHandler: the handler only notes the signal; after every iteration
// the trainer asks all ranks whether any received it (one all-reduce), and if so every rank saves
// the checkpoint (with --save) and exits normally at the same iteration. A batch system's
// SIGTERM before its time limit (Slurm's --signal=TERM@T) then ends in a checkpoint, not a loss.
#pragma once

namespace gale {

// Installs the SIGTERM handler (sigaction; async-signal-safe: it sets a flag). Idempotent.
void install_exit_signal_handler();

// True once SIGTERM has reached this process after install_exit_signal_handler().
bool exit_signal_received();

}  // namespace gale
