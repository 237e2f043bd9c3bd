#!/usr/bin/env python3
"""Megatron-LM main's GRPO sequence packing on small cases: writes tests/data/reference/grpo_packing/fixture.json.

Runs Megatron-LM's OWN SequencePacker.pack_sequences and distribute_packed_bins (with its
create_empty_bins and PackingInfo) from megatron/rl/sequence_packing_utils.py, and its
round_up_to_nearest_multiple from megatron/core/utils.py. Nothing is copied: the source is read from
the Megatron-LM checkout (a git directory; MEGATRON_LM_GIT, default /work/.mirror/NVIDIA+Megatron-LM/repo,
at MEGATRON_LM_REV, default HEAD), parsed with ast and executed with stubs for what the functions
reach for outside (mpu's data-parallel rank and size, get_tokenizer's pad id, log_single_rank).

Each case: rollouts of given lengths (tokens 1..9 then the pad id 0, generation mask 1 after a
2-token prompt), the bin size, --rl-sequence-packing-max-sequences-per-bin, the slot multiple
(2*CP at CP > 1), --rl-sequence-packing-algo and the data-parallel size; for every data-parallel
rank Megatron's bins: the rollouts in each (bin_seq_indices), their starts (seq_starts), and the
packed tokens, position ids and loss mask.

Usage: /usr/bin/python3 tools/reference/grpo_packing_reference.py   (Debian's torch 1.13)
Deterministic: rerunning reproduces the committed file.
"""
import ast
import dataclasses
import json
import logging
import math
import os
import subprocess
import sys
import typing

import numpy as np
import torch

GIT = os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo")
REV = os.environ.get("MEGATRON_LM_REV", "HEAD")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference",
                   "grpo_packing", "fixture.json")
PAD = 0


def show(path):
    return subprocess.run(["git", "-C", GIT, "show", f"{REV}:{path}"], check=True, capture_output=True,
                          text=True).stdout


class Mpu:
    rank, size = 0, 1

    def get_data_parallel_rank(self):
        return self.rank

    def get_data_parallel_world_size(self):
        return self.size


class Tokenizer:
    pad = PAD


def megatron_packing(mpu):
    utils = [n for n in ast.parse(show("megatron/core/utils.py")).body
             if isinstance(n, ast.FunctionDef) and n.name == "round_up_to_nearest_multiple"]
    wanted = {"PackingInfo", "SequencePacker", "get_actual_sequence_lengths", "create_empty_bins",
              "distribute_packed_bins"}
    nodes = [n for n in ast.parse(show("megatron/rl/sequence_packing_utils.py")).body
             if isinstance(n, (ast.FunctionDef, ast.ClassDef)) and n.name in wanted]
    if len(utils) != 1 or {n.name for n in nodes} != wanted:
        sys.exit("sequence_packing_utils.py / utils.py no longer define " + ", ".join(sorted(wanted)))
    env = {"torch": torch, "math": math, "np": np, "typing": typing, "dataclass": dataclasses.dataclass,
           "field": dataclasses.field, "List": typing.List, "Dict": typing.Dict, "Any": typing.Any,
           "Tuple": typing.Tuple, "Optional": typing.Optional, "logging": logging,
           "logger": logging.getLogger("sequence_packing_utils"), "log_single_rank": lambda *a, **k: None,
           "mpu": mpu, "get_tokenizer": lambda: Tokenizer()}
    exec(compile(ast.Module(body=utils + nodes, type_ignores=[]), "sequence_packing_utils.py", "exec"), env)
    return env


def case(env, mpu, name, lengths, bin_size, max_per_bin, multiple, algo, dp):
    trajs = torch.full((len(lengths), bin_size), PAD, dtype=torch.long)
    gen = torch.zeros((len(lengths), bin_size), dtype=torch.bool)
    for i, n in enumerate(lengths):
        trajs[i, :n] = torch.tensor([1 + (i + s) % 9 for s in range(n)])
        gen[i, 2:n] = True
    packer = env["SequencePacker"](bin_size=bin_size, pad_token=PAD, max_sequences_per_bin=max_per_bin,
                                   seq_length_multiple=multiple)
    packed, positions, mask, info = packer.pack_sequences(trajs, gen)
    info.packing_algo = algo
    ranks = []
    mpu.size = dp
    for r in range(dp):
        mpu.rank = r
        t, p, m, i = env["distribute_packed_bins"](packed, positions, mask, info)
        ranks.append({"bins": [list(map(int, b)) for b in i.bin_seq_indices],
                      "starts": [list(map(int, i.seq_starts[b])) for b in range(len(i.bin_seq_indices))],
                      "tokens": t.tolist(), "position_ids": p.tolist(), "loss_mask": m.tolist()})
    return {"name": name, "lengths": lengths, "bin_size": bin_size, "max_sequences_per_bin": max_per_bin,
            "seq_length_multiple": multiple, "algo": algo, "dp": dp, "total_bins": int(packed.shape[0]),
            "ranks": ranks}


def main():
    mpu = Mpu()
    env = megatron_packing(mpu)
    commit = subprocess.run(["git", "-C", GIT, "rev-parse", REV], check=True, capture_output=True,
                            text=True).stdout.strip()
    rng = np.random.default_rng(7)
    cases = [
        case(env, mpu, "fifo_dp1", [5, 7, 3, 7, 2, 6, 4, 4], 16, 50, 1, "fifo", 1),
        case(env, mpu, "fifo_dp2_uneven", [5, 7, 3, 7, 2, 6, 4, 4, 9], 16, 50, 1, "fifo", 2),
        case(env, mpu, "round_robin_dp2", [5, 7, 3, 7, 2, 6, 4, 4, 9], 16, 50, 1, "round-robin", 2),
        case(env, mpu, "max_two_per_bin", [2, 3, 2, 3, 2, 3], 16, 2, 1, "fifo", 1),
        case(env, mpu, "cp2_slots_of_4", [5, 7, 3, 7, 2, 6, 4, 4], 16, 50, 4, "fifo", 1),
        case(env, mpu, "random_dp3", [int(x) for x in rng.integers(1, 25, size=14)], 32, 4, 2, "round-robin", 3),
        case(env, mpu, "random_fifo_dp4", [int(x) for x in rng.integers(1, 25, size=11)], 32, 50, 1, "fifo", 4),
    ]
    out = {"megatron_commit": commit, "pad": PAD, "cases": cases}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(out, f, indent=None, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {os.path.relpath(OUT)} ({len(cases)} cases)")


if __name__ == "__main__":
    main()
