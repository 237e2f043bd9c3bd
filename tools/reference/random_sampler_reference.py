#!/usr/bin/env python3
"""Golden values for Megatron's --dataloader-type cyclic sample order (tests/data/random_sampler_test.cc).

Writes tests/data/reference/random_sampler.json with
  * "randperm": torch.randperm(n, generator=g) after g.manual_seed(seed), CPU, int64: whole
    permutations for small n, and head / tail / every 9973rd element for larger n;
  * "streams": for a few (total, micro_batch_size, dp, rank, consumed, data_sharding) cases, the
    first micro-batches one data-parallel rank reads from a sampler built at `consumed` and
    iterated the way Megatron's cyclic_iter iterates its DataLoader (the sampler's __iter__ is
    started again, with its updated consumed count, whenever an epoch runs out), including
    epoch wraps in the middle of a global batch.

The sampler below is an independent re-statement of Megatron's MegatronPretrainingRandomSampler
(megatron/training/datasets/data_samplers.py) written from its documented behaviour; only torch
is needed. Run with torch 2.5.1 (/tmp/tv/bin/python):

    /tmp/tv/bin/python tools/reference/random_sampler_reference.py
"""

import json
import os

import torch


def randperm(n, seed):
    g = torch.Generator()
    g.manual_seed(seed)
    return torch.randperm(n, generator=g).tolist()


class CyclicRankStream:
    """The micro-batches one data-parallel rank draws, epoch after epoch."""

    def __init__(self, total, mbs, dp, rank, consumed, sharding):
        self.total, self.mbs, self.dp, self.rank = total, mbs, dp, rank
        self.consumed, self.sharding = consumed, sharding

    def one_epoch(self):
        chunk = self.mbs * self.dp
        active = self.total - self.total % chunk
        epoch, offset = divmod(self.consumed, active)
        assert offset % chunk == 0
        if self.sharding:
            bucket = (self.total // chunk) * self.mbs
            order = [self.rank * bucket + x for x in randperm(bucket, epoch)[offset // self.dp:]]
        else:
            full = (self.total // self.mbs) * self.mbs
            order = randperm(full, epoch)[offset:][self.rank::self.dp]
        for start in range(0, len(order) - self.mbs + 1, self.mbs):
            self.consumed += chunk  # counted when the micro-batch is handed out
            yield order[start:start + self.mbs]

    def take(self, count):
        out = []
        while len(out) < count:
            for mb in self.one_epoch():  # a fresh pass per epoch, as cyclic_iter restarts the loader
                out.append(mb)
                if len(out) == count:
                    break
        return out


def main():
    torch.set_num_threads(1)
    out = {"torch_version": torch.__version__, "randperm": [], "streams": []}
    for n, seed in [(0, 0), (1, 0), (2, 0), (3, 1), (10, 0), (10, 3), (17, 42), (100, 7), (1000, 2**32 + 5)]:
        out["randperm"].append({"n": n, "seed": seed, "perm": randperm(n, seed)})
    for n, seed in [(123457, 0), (2000003, 11)]:
        p = randperm(n, seed)
        out["randperm"].append({"n": n, "seed": seed, "head": p[:16], "tail": p[-16:], "every": 9973,
                                "strided": p[::9973]})
    cases = [
        # total, mbs, dp, rank, consumed, sharding, micro-batches
        (10, 1, 1, 0, 0, True, 25),     # epochs of 10, wraps inside a batch
        (10, 2, 1, 0, 0, False, 12),
        (23, 2, 2, 0, 0, True, 14),     # active 20, bucket 10 per rank
        (23, 2, 2, 1, 0, True, 14),
        (23, 2, 2, 1, 8, True, 10),     # started after 8 consumed samples (a resumed run)
        (23, 2, 2, 0, 20, True, 6),     # started at the second epoch
        (21, 2, 2, 0, 0, False, 12),    # full bucket 20 = active 20: ranks stay in step
        (21, 2, 2, 1, 4, False, 12),
        (37, 3, 2, 1, 12, False, 10),   # full 36 = active 36
        (50, 4, 3, 2, 36, True, 9),     # active 48, bucket 16
        (1000, 4, 2, 1, 992, True, 4),  # the epoch wraps after the first micro-batch
        # full bucket 5 > active 3: ranks 0 and 1 read a second micro-batch from epoch 0 (out of step)
        (5, 1, 3, 0, 0, False, 2),
        (5, 1, 3, 2, 0, False, 2),
    ]
    for total, mbs, dp, rank, consumed, sharding, count in cases:
        stream = CyclicRankStream(total, mbs, dp, rank, consumed, sharding)
        out["streams"].append({"total": total, "micro_batch_size": mbs, "data_parallel_size": dp, "rank": rank,
                               "consumed": consumed, "data_sharding": sharding,
                               "micro_batches": stream.take(count)})
    path = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "random_sampler.json")
    with open(path, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.normpath(path))


if __name__ == "__main__":
    main()
