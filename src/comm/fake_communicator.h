// --fake-process-group's communicator: one process plays one rank of a larger world, nothing moves.
//
// Megatron-LM's --fake-process-group initialises torch.distributed with torch's "fake" backend
// (FakeProcessGroup): WORLD_SIZE and RANK name the simulated layout, every collective returns at
// once, and one device measures the memory of one rank of a distributed run. Gale's fake
// communicator is the same for its interface. What each operation leaves in its buffers:
//   all_reduce       the buffer untouched (this rank's own value), as torch's fake backend;
//   broadcast        the buffer untouched on every rank (the root's value only on the root), as torch;
//   all_gather       every block of recv = this rank's send buffer, as torch's fake all-gather
//                    ("each rank has the same input");
//   reduce_scatter   recv = block rank() of send (this rank's own contribution). torch's fake backend
//                    leaves the output untouched; Megatron reduce-scatters in place (the output is
//                    that block of the input), so it sees exactly this;
//   all_to_all      every block of recv = block rank() of send: every rank is taken to send this rank
//                    what this rank sends itself, the all-gather's assumption (torch leaves the output
//                    untouched; Megatron sizes its all-to-all from an all-gather of the token counts,
//                    which is this). Token counts exchanged so are consistent with the data exchange;
//   all_to_allv      recv block j = block rank() of send, cut or zero-padded to recv_counts[j];
//   send             dropped;
//   recv             the buffer filled with zeros (torch leaves it untouched: Megatron's receive
//                    buffers are uninitialised memory; zeros keep the run deterministic);
//   barrier          nothing.
// Every operation completes at once (the Work is already complete), so no pipeline schedule can
// hang. CommStats count calls and bytes exactly as the MPI backend does, so --profile's trace and
// the communication counters tell what the simulated rank would send.
#pragma once

#include <string>
#include <vector>

#include "comm/communicator.h"
#include "core/status.h"

namespace gale {

// A fake group whose members are `world_ranks` (global ranks, in group-rank order), this process
// being group rank `rank`. Its make_group makes fake sub-groups of the same world.
Comm make_fake_communicator(int rank, std::vector<int> world_ranks, const std::string& name = "world");

// --fake-process-group's world, as Megatron reads it: size $WORLD_SIZE (default 1), this process's
// rank $RANK (default 0). Errors name the variable, what is expected and what was found; a start
// under mpirun/srun is refused (each process of a fake run is alone; start it once per rank to
// simulate).
StatusOr<Comm> init_fake_world();

}  // namespace gale
