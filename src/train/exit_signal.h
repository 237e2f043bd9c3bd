// --exit-signal-handler: SIGTERM recorded by a watcher thread and acted on between iterations.
//
// Megatron's DistributedSignalHandler: the handler only notes the signal; after every iteration
// the trainer asks all ranks whether any received it (one all-reduce), and if so every rank saves
// the checkpoint (with --save) and exits normally at the same iteration. A batch system's
// SIGTERM before its time limit (Slurm's --signal=TERM@T) then ends in a checkpoint, not a loss.
#pragma once

namespace gale {

// Blocks SIGTERM in the calling thread (and so in every thread it starts afterwards) and starts a
// thread that takes it with sigwait and sets the flag. Call it before any other thread starts
// (gale pretrain: right after parsing, before MPI_Init): an asynchronous handler running on a
// compute thread interrupts whatever runs there, and that corrupted the heap now and then even
// though the handler only set a flag (about one SIGTERM in 10-20 ended in "corrupted size vs.
// prev_size" at the next allocation on this machine; none in 160 with oneDNN limited to SSE4.1,
// so its AVX2 JIT GEMM kernels are the likely victims; none in 270 with the signal blocked). A
// sigaction handler that only sets the flag stays installed for threads that existed before.
// Idempotent.
void install_exit_signal_handler();

// True once SIGTERM has reached this process after install_exit_signal_handler().
bool exit_signal_received();

}  // namespace gale
