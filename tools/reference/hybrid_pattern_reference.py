#!/usr/bin/env python3
"""Records what Megatron-LM main's own hybrid-pattern parser makes of a list of --hybrid-layer-pattern texts.

Gale's parser of the unified hybrid pattern ("<main>/<mtp>/<mtp>...", '|' between pipeline stages of
the main pattern; src/model/hybrid_pattern.h) must accept, split and refuse exactly what Megatron's
megatron/core/models/hybrid/hybrid_layer_allocation.py does. This script does not re-derive that: it
loads that one file from a Megatron-LM checkout (main; its only Megatron import, megatron.core.utils'
two logging helpers, is replaced by no-ops) and calls its real functions:

  * parse_hybrid_pattern(pattern): main pattern, MTP pattern, MTP depths, or the ValueError;
  * get_hybrid_total_layer_count / get_hybrid_total_pipeline_segment_count;
  * select_pipeline_segment(main, pp_group, vp_stage) for every pipeline rank and virtual stage, with
    torch.distributed.get_rank / get_world_size answering the simulated pipeline rank and size, and
    the virtual pipeline size derived as megatron/training/arguments.py derives it (segments / PP
    when the pattern has more segments than PP ranks, none otherwise).

Each error is recorded with Megatron's message and a kind the C++ test maps to Gale's error:
invalid_symbol (with the symbol and "main" or "MTP"), attention_with_mla, mtp_not_identical,
segments_not_divisible, layers_not_divisible.

Output: tests/data/reference/hybrid_pattern/megatron_parse.json, a list of
  {"pattern": str, "parse": {"main": str|null, "mtp": str|null, "depths": n} | {"error": ..., "kind": ...},
   "layers": n | null, "segments": n,
   "splits": [{"pp": P, "vpp": V|null, "stages": [[[layers, offset] per virtual stage] per rank]}
              | {"pp": P, "error": ..., "kind": ...}]}
read by tests/model/hybrid_pattern_test.cc.

Usage: /usr/bin/python3 tools/reference/hybrid_pattern_reference.py MEGATRON_FILE [OUT]
(MEGATRON_FILE: megatron/core/models/hybrid/hybrid_layer_allocation.py of Megatron-LM main, e.g.
`git --git-dir <mirror> show HEAD:megatron/core/models/hybrid/hybrid_layer_allocation.py > f.py`;
the fixture was written from commit d98e8a64ddf34856e74b24714e3bedb2f5a39553 with Debian's torch 1.13.)
"""
import importlib.util
import json
import os
import re
import sys
import types

import torch


def load(path):
    utils = types.ModuleType("megatron.core.utils")
    utils.log_on_each_pipeline_stage = lambda *a, **k: None
    utils.log_single_rank = lambda *a, **k: None
    for name in ["megatron", "megatron.core"]:
        sys.modules[name] = types.ModuleType(name)
    sys.modules["megatron.core.utils"] = utils
    spec = importlib.util.spec_from_file_location("hybrid_layer_allocation", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def kind(message):
    m = re.match(r"In (main|MTP) pattern, '(.)' is not a valid layer symbol", message)
    if m:
        return {"kind": "invalid_symbol", "where": m.group(1), "symbol": m.group(2)}
    m = re.match(r"In hybrid layer pattern segment, '(.)' is not", message)
    if m:
        return {"kind": "invalid_symbol", "where": "main", "symbol": m.group(1)}
    if message.startswith("Not supported to have both Attention and MLA/DSA"):
        return {"kind": "attention_with_mla"}
    m = re.match(r"All MTP patterns must be identical\. Pattern 1 is '(.*)', but pattern (\d+) is '(.*)'\.", message)
    if m:
        return {"kind": "mtp_not_identical", "index": int(m.group(2))}
    if "pipe-delimited segments" in message and "evenly divisible" in message:
        return {"kind": "segments_not_divisible"}
    if message.startswith("Number of layers") and "evenly divisible" in message:
        return {"kind": "layers_not_divisible"}
    raise SystemExit("unclassified Megatron error: " + message)


def error(e):
    out = {"error": str(e)}
    out.update(kind(str(e)))
    return out


class Rank:
    """torch.distributed's rank and size of the simulated pipeline group."""

    def __init__(self, rank, size):
        self.rank, self.size = rank, size


def split(hla, main, pp):
    segments = main.split(hla.Symbols.PIPE) if main else [""]
    vpp = len(segments) // pp if len(segments) > pp and len(segments) % pp == 0 else None
    torch.distributed.get_rank = lambda g=None: g.rank
    torch.distributed.get_world_size = lambda g=None: g.size
    stages = []
    try:
        for r in range(pp):
            row = []
            for v in range(vpp or 1):
                layers, offset = hla.select_pipeline_segment(main, Rank(r, pp), v if vpp else None)
                row.append(["".join(layers), offset])
            stages.append(row)
    except ValueError as e:
        return dict({"pp": pp}, **error(e))
    return {"pp": pp, "vpp": vpp, "stages": stages}


PATTERNS = [
    # plain and pipe-split main patterns
    "M*-M", "M*M*|M*M*", "M*-|M", "M*-|M*", "M|*|-|M", "M*||M*", "|M*M*", "M*M*|", "M-M-|M-M*-|MM|E*",
    "MGE*|-M", "MMMMMMMM", "M*-M*",
    # MTP
    "M*M*/MM/MM", "MMMM/*M/*M/*M", "M-M-|M-M*-/MM/MM", "M*M*/", "M*M*//", "M*M*/MM/", "M*M*/MM/M*", "/MM/MM",
    "M*/*-", "M*/M|M",
    # bad symbols and mixes
    "M*x", "M*|Mx", "M*/Mq", "M*+", "M+|*", "M+D-", "M*/+M", "M+/*M", "MD-M", "M *",
]
PP_SIZES = [1, 2, 3, 4]


def main():
    if os.environ.get("PYTHONHASHSEED") != "0":  # Megatron's messages print a set: one fixed order
        os.execve(sys.executable, [sys.executable] + sys.argv, dict(os.environ, PYTHONHASHSEED="0"))
    if len(sys.argv) < 2:
        raise SystemExit(__doc__)
    hla = load(sys.argv[1])
    out = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "hybrid_pattern",
                       "megatron_parse.json") if len(sys.argv) < 3 else sys.argv[2]
    cases = []
    for pattern in PATTERNS:
        case = {"pattern": pattern}
        try:
            p = hla.parse_hybrid_pattern(pattern)
            case["parse"] = {"main": p.main_pattern, "mtp": p.mtp_pattern, "depths": p.mtp_num_depths}
        except ValueError as e:
            case["parse"] = error(e)
        try:
            case["layers"] = hla.get_hybrid_total_layer_count(pattern)
        except ValueError:
            case["layers"] = None
        case["segments"] = hla.get_hybrid_total_pipeline_segment_count(pattern)
        if "error" not in case["parse"]:
            main_pattern = pattern.split(hla.Symbols.MTP_SEPARATOR)[0]
            case["splits"] = [split(hla, main_pattern, pp) for pp in PP_SIZES]
        cases.append(case)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    with open(out, "w") as f:
        json.dump(cases, f, indent=1)
        f.write("\n")
    print("wrote", len(cases), "cases to", out)


if __name__ == "__main__":
    main()
