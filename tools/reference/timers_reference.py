# Reference reports for tests/core/timers_test.cc: Megatron-LM's own megatron/core/timers.py
# formats a fixed matrix of per-rank seconds (as its all-gather would return it) for
# --timing-log-option minmax, max and all, and its Timers.write's (tag, value) pairs; the C++
# test holds the printed strings.
#
#   /tmp/tv/bin/python tools/reference/timers_reference.py /path/to/Megatron-LM
#
# (torch 2.5.1; Megatron-LM main of 2026-08-22, d98e8a6). Only the gathering is replaced (the
# collective needs torch.distributed); Megatron's min/max, filtering, normalisation and formatting run.
import importlib.util
import sys
import types

import torch

megatron = sys.argv[1]
# timers.py imports one helper from megatron.core.utils; give it a stand-in.
utils = types.ModuleType("megatron.core.utils")
utils.is_torch_min_version = lambda v: True
for name in ("megatron", "megatron.core"):
    sys.modules[name] = types.ModuleType(name)
sys.modules["megatron.core.utils"] = utils
spec = importlib.util.spec_from_file_location("megatron_timers", megatron + "/megatron/core/timers.py")
mt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mt)

# The matrix the C++ test gathers: 3 ranks x 4 timers, seconds (float32 as Megatron's tensor).
NAMES = ["forward-backward", "forward-recv", "a-timer-name-longer-than-forty-seven-characters-x", "never-ran"]
TIMES = torch.tensor([[0.5, 0.0, 0.001, 0.0],
                      [0.75, 0.125, 0.002, 0.0],
                      [0.6251, 0.25, 0.0035, 0.0]], dtype=torch.float)
NORMALIZER = 2.0  # --log-interval 2
torch.distributed.get_world_size = lambda group=None: TIMES.shape[0]

for option in ("minmax", "max", "all"):
    timers = mt.Timers(2, option)
    timers._get_elapsed_time_all_ranks = lambda names, reset, barrier: TIMES.clone()
    print(f"--- {option}")
    print(repr(timers.get_all_timers_string(NAMES, normalizer=NORMALIZER)))


class Writer:
    def add_scalar(self, tag, value, step):
        print(repr((tag, value, step)))


mt.SummaryWriter = Writer
timers = mt.Timers(2, "minmax")
timers._get_elapsed_time_all_ranks = lambda names, reset, barrier: TIMES.clone()
print("--- write")
timers.write(NAMES, Writer(), 4, normalizer=NORMALIZER)
