#!/usr/bin/env python3
"""Records the order in which Megatron-LM's own pipeline schedules run forward and backward steps,
and which transformer layers Megatron places on each pipeline rank and virtual stage.

Gale's 1F1B and interleaved 1F1B schedules must run the (forward/backward, model chunk,
micro-batch) steps of every pipeline rank in exactly Megatron's order. This script does not
re-derive that order: it imports Megatron-Core's `schedules.py` (tag core_v0.12.1) and runs its
real `forward_backward_pipelining_without_interleaving` and
`forward_backward_pipelining_with_interleaving` in one process, once per simulated pipeline rank,
with three things replaced by recorders:

  * `parallel_state`'s pipeline size, rank and virtual rank are set for the simulated rank;
  * `p2p_communication`'s send/recv functions return zero tensors of the requested shape (no
    communication happens; the schedule's control flow does not depend on the values);
  * `schedules.forward_step` / `schedules.backward_step` append ("F" or "B", model chunk,
    micro-batch) to the rank's record. The chunk is the virtual pipeline rank the schedule set
    before the call; the micro-batch is the number of earlier forward (backward) steps of the same
    chunk, i.e. the position in that chunk's data iterator (forward) and in its FIFO of saved
    activations (backward), which is what Megatron feeds the step.

Output: tests/data/schedule/megatron_order.json, a list of cases
  {"pp": P, "vpp": V or null, "num_microbatches": M, "forward_only": bool,
   "ranks": [["F 0 0", "F 0 1", "B 0 0", ...] for each pipeline rank]}
read by tests/schedule/pipeline_order_test.cc.

The layer placement comes from Megatron's own `get_transformer_layer_offset`
(transformer_layer.py) and `get_num_layers_to_build` (transformer_block.py): their function
bodies are compiled from the checkout and called with the pipeline rank and virtual rank set.
Output: tests/data/schedule/megatron_layers.json, a list of
  {"num_layers": L, "pp": P, "vpp": V or null, "first": n or null, "last": n or null,
   ["embedding": bool, "loss": bool,]
   "chunks": [[[first_layer, num_layers] for each virtual stage] for each pipeline rank]}
("embedding"/"loss": --account-for-embedding/loss-in-pipeline-split, given only when set.)
read by tests/train/chunk_layers_test.cc. (Megatron core_v0.12.1 places layers wrongly when
virtual stages are combined with --decoder-last-pipeline-num-layers but not
--decoder-first-pipeline-num-layers: ranks 0 and 1 get the same layers; with PP 2 and both
uneven flags it divides by zero. Both cases are left out.)

Usage (needs torch and `packaging`, and a Megatron-LM checkout of tag core_v0.12.1; Debian's
torch 1.13 is too old for megatron/core/__init__.py, so only the modules schedules.py needs are
loaded, with three unrelated imports stubbed):
    /usr/bin/python3 -m venv --system-site-packages /tmp/gale-ref-venv
    /tmp/gale-ref-venv/bin/pip install packaging
    git -C Megatron-LM archive core_v0.12.1 megatron/core | tar -x -C /tmp/megatron012
    /tmp/gale-ref-venv/bin/python tools/reference/pipeline_order.py --megatron /tmp/megatron012 \
        [--out tests/data/schedule]
The output is deterministic.
"""
import argparse
import ast
import importlib
import json
import os
import sys
import types

import torch

# (pp, vpp or None, num_microbatches, forward_only[, microbatch_group_size_per_vp_stage])
CASES = [
    (2, None, 1, False), (2, None, 2, False), (2, None, 4, False), (2, None, 5, False),
    (3, None, 5, False), (4, None, 2, False), (4, None, 4, False), (4, None, 8, False),
    (4, None, 3, True),
    (2, 2, 2, False), (2, 2, 4, False), (2, 2, 6, False), (2, 3, 4, False),
    (3, 2, 6, False), (4, 2, 4, False), (4, 2, 8, False), (4, 3, 8, False),
    (2, 2, 4, True), (4, 2, 8, True),
    # --microbatch-group-size-per-virtual-pipeline-stage G > P, with and without a short last group
    (2, 2, 5, False, 3), (2, 2, 6, False, 3), (2, 2, 6, False, 4), (2, 3, 8, False, 3), (3, 2, 7, False, 4),
    (4, 2, 8, False, 8), (2, 2, 5, True, 3),
]

# (num_layers, pp, vpp or None, decoder_first_pipeline_num_layers, decoder_last_pipeline_num_layers)
LAYER_CASES = [
    (4, 2, None, None, None), (8, 4, None, None, None), (8, 2, 2, None, None), (8, 4, 2, None, None),
    (12, 2, 3, None, None), (8, 4, None, 1, 3), (7, 4, None, 1, None), (9, 4, None, None, 3),
    (6, 3, None, 1, 3), (12, 4, 2, 2, 2), (14, 4, 2, 2, None), (16, 4, 2, 4, 4),
    # (..., account_for_embedding_in_pipeline_split, account_for_loss_in_pipeline_split)
    (3, 2, None, None, None, True, False), (7, 4, None, None, None, False, True),
    (6, 4, None, None, None, True, True), (2, 2, None, None, None, True, True),
    (5, 2, 3, None, None, True, False), (7, 2, 2, None, None, False, True), (2, 2, 2, None, None, True, True),
    (14, 4, 2, None, None, True, True), (4, 1, None, None, None, True, True),
]


def load_schedules(megatron_root):
    """Imports megatron.core.pipeline_parallel.schedules without running megatron/core/__init__.py."""
    root = os.path.join(megatron_root, "megatron")

    def package(name, path):
        m = types.ModuleType(name)
        m.__path__ = [path]
        sys.modules[name] = m
        return m

    package("megatron", root)
    core = package("megatron.core", os.path.join(root, "core"))
    package("megatron.core.transformer", os.path.join(root, "core", "transformer"))
    package("megatron.core.transformer.moe", os.path.join(root, "core", "transformer", "moe"))
    package("megatron.core.pipeline_parallel", os.path.join(root, "core", "pipeline_parallel"))
    # Unrelated to the schedule order (CUDA graphs, MoE and MTP loss scalers), and they need a
    # newer torch: stub them.
    for name, attr in [("megatron.core.transformer.cuda_graphs", "create_cudagraphs"),
                       ("megatron.core.transformer.moe.router", "MoEAuxLossAutoScaler"),
                       ("megatron.core.transformer.multi_token_prediction", "MTPLossAutoScaler")]:
        m = types.ModuleType(name)
        setattr(m, attr, None)
        sys.modules[name] = m
    core.ModelParallelConfig = importlib.import_module("megatron.core.model_parallel_config").ModelParallelConfig
    schedules = importlib.import_module("megatron.core.pipeline_parallel.schedules")
    return schedules


class Recorder:
    def __init__(self, schedules):
        self.s = schedules
        self.ps = schedules.parallel_state
        self.events = []
        self.forwards = {}
        self.backwards = {}

    def chunk(self):
        v = self.ps.get_virtual_pipeline_model_parallel_rank()
        return 0 if v is None else v

    def forward_step(self, forward_step_func, data_iterator, model, num_microbatches, input_tensor, *args, **kwargs):
        c = self.chunk()
        m = self.forwards.get(c, 0)
        self.forwards[c] = m + 1
        self.events.append(f"F {c} {m}")
        return torch.zeros(1, requires_grad=True), 1

    def backward_step(self, input_tensor, output_tensor, output_tensor_grad, model_type, config):
        c = self.chunk()
        m = self.backwards.get(c, 0)
        self.backwards[c] = m + 1
        self.events.append(f"B {c} {m}")
        # The gradient sent to the previous stage: its value is never looked at.
        return [None] if isinstance(input_tensor, list) else None


def patch_p2p(schedules):
    p2p = schedules.p2p_communication

    def zeros(shape):
        return torch.zeros(shape)

    def recv_forward(tensor_shape, config, *a, **k):
        return None if schedules.parallel_state.is_pipeline_first_stage() else zeros(tensor_shape)

    def recv_backward(tensor_shape, config, *a, **k):
        return None if schedules.parallel_state.is_pipeline_last_stage() else zeros(tensor_shape)

    def send(*a, **k):
        return None

    def send_forward_recv_backward(output_tensor, tensor_shape, config, *a, **k):
        return None if schedules.parallel_state.is_pipeline_last_stage() else zeros(tensor_shape)

    def send_backward_recv_forward(input_tensor_grad, tensor_shape, config, *a, **k):
        return None if schedules.parallel_state.is_pipeline_first_stage() else zeros(tensor_shape)

    def pair(recv_a, recv_b, tensor_shape, overlap):
        a = zeros(tensor_shape) if recv_a else None
        b = zeros(tensor_shape) if recv_b else None
        return (a, b, {}) if overlap else (a, b)

    def send_forward_recv_forward(output_tensor, recv_prev, tensor_shape, config, overlap_p2p_comm=False):
        t = zeros(tensor_shape) if recv_prev else None
        return (t, {}) if overlap_p2p_comm else t

    def send_backward_recv_backward(input_tensor_grad, recv_next, tensor_shape, config, overlap_p2p_comm=False):
        t = zeros(tensor_shape) if recv_next else None
        return (t, {}) if overlap_p2p_comm else t

    def send_forward_backward_recv_forward_backward(output_tensor, input_tensor_grad, recv_prev, recv_next,
                                                    tensor_shape, config):
        return (zeros(tensor_shape) if recv_prev else None, zeros(tensor_shape) if recv_next else None)

    p2p.recv_forward = recv_forward
    p2p.recv_backward = recv_backward
    p2p.send_forward = send
    p2p.send_backward = send
    p2p.send_forward_recv_backward = send_forward_recv_backward
    p2p.send_backward_recv_forward = send_backward_recv_forward
    p2p.send_forward_recv_forward = send_forward_recv_forward
    p2p.send_backward_recv_backward = send_backward_recv_backward
    p2p.send_forward_backward_recv_forward_backward = send_forward_backward_recv_forward_backward
    # The non-interleaved schedule calls module-level wrappers that take lists of shapes.
    schedules.recv_forward = lambda shapes, config: [recv_forward(s, config) for s in shapes]
    schedules.recv_backward = lambda shapes, config: [recv_backward(s, config) for s in shapes]
    schedules.send_forward = lambda *a, **k: None
    schedules.send_backward = lambda *a, **k: None
    schedules.send_forward_recv_backward = lambda out, shapes, config: [
        send_forward_recv_backward(None, s, config) for s in shapes]
    schedules.send_backward_recv_forward = lambda grads, shapes, config: [
        send_backward_recv_forward(None, s, config) for s in shapes]


class FakeChunk(torch.nn.Module):
    def __init__(self, config):
        super().__init__()
        self.config = config
        self.model_type = None

    def set_input_tensor(self, t):
        pass


def run_case(schedules, pp, vpp, num_mb, forward_only, group=None):
    ps = schedules.parallel_state
    ranks = []
    for rank in range(pp):
        ps.set_pipeline_model_parallel_world_size(pp)
        ps.set_pipeline_model_parallel_rank(rank)
        ps.set_virtual_pipeline_model_parallel_world_size(vpp)
        ps.set_virtual_pipeline_model_parallel_rank(0 if vpp else None)
        config = sys.modules["megatron.core"].ModelParallelConfig(pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=vpp,
                                     pipeline_dtype=torch.float32, overlap_p2p_comm=False, batch_p2p_comm=True,
                                     microbatch_group_size_per_vp_stage=(group or pp) if vpp else None)
        config.hidden_size = 4
        chunks = [FakeChunk(config) for _ in range(vpp or 1)]
        rec = Recorder(schedules)
        schedules.forward_step = rec.forward_step
        schedules.backward_step = rec.backward_step
        common = dict(forward_step_func=None, num_microbatches=num_mb, seq_length=2, micro_batch_size=1,
                      forward_only=forward_only)
        if vpp:
            schedules.forward_backward_pipelining_with_interleaving(
                data_iterator=[None] * vpp, model=chunks, **common)
        else:
            schedules.forward_backward_pipelining_without_interleaving(
                data_iterator=None, model=chunks, **common)
        ranks.append(rec.events)
    case = {"pp": pp, "vpp": vpp, "num_microbatches": num_mb, "forward_only": forward_only}
    if group is not None:
        case["microbatch_group_size"] = group
    case["ranks"] = ranks
    return case


def load_function(path, name, namespace):
    """Compiles function `name` of Megatron source file `path` (without importing its module)."""
    tree = ast.parse(open(path).read())
    node = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == name][0]
    exec(compile(ast.Module(body=[node], type_ignores=[]), path, "exec"), namespace)
    return namespace[name]


def layer_layouts(schedules, megatron_root):
    ps = schedules.parallel_state
    namespace = {"parallel_state": ps, "TransformerConfig": object}
    core = os.path.join(megatron_root, "megatron", "core", "transformer")
    offset = load_function(os.path.join(core, "transformer_layer.py"), "get_transformer_layer_offset", namespace)
    count = load_function(os.path.join(core, "transformer_block.py"), "get_num_layers_to_build", namespace)
    cases = []
    for num_layers, pp, vpp, first, last, *account in LAYER_CASES:
        embedding, loss = account or (False, False)
        ranks = []
        for rank in range(pp):
            ps.set_pipeline_model_parallel_world_size(pp)
            ps.set_pipeline_model_parallel_rank(rank)
            ps.set_virtual_pipeline_model_parallel_world_size(vpp)
            chunks = []
            for v in range(vpp or 1):
                ps.set_virtual_pipeline_model_parallel_rank(v if vpp else None)
                config = types.SimpleNamespace(
                    num_layers=num_layers, pipeline_model_parallel_size=pp, num_layers_in_first_pipeline_stage=first,
                    num_layers_in_last_pipeline_stage=last, account_for_embedding_in_pipeline_split=embedding,
                    account_for_loss_in_pipeline_split=loss)
                chunks.append([offset(config), count(config)])
            ranks.append(chunks)
        case = {"num_layers": num_layers, "pp": pp, "vpp": vpp, "first": first, "last": last}
        if account:
            case.update({"embedding": embedding, "loss": loss})
        case["chunks"] = ranks
        cases.append(case)
    return cases


def write_json_lines(path, cases):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w") as f:
        f.write("[\n")
        for i, c in enumerate(cases):
            f.write("  " + json.dumps(c) + (",\n" if i + 1 < len(cases) else "\n"))
        f.write("]\n")
    print(f"wrote {len(cases)} cases to {path}")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--megatron", required=True, help="directory holding megatron/core of tag core_v0.12.1")
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "schedule"),
                    help="directory for megatron_order.json and megatron_layers.json")
    args = ap.parse_args()
    schedules = load_schedules(args.megatron)
    # get_model_type reads .model_type through the wrapper helpers; the schedules only compare it
    # with ModelType.encoder_and_decoder.
    schedules.get_model_type = lambda model: schedules.ModelType.encoder_or_decoder
    schedules.get_model_xattn = lambda model: False
    # No GPU: the token counter the schedules keep stays on the CPU.
    torch.Tensor.cuda = lambda self, *a, **k: self
    # No process groups exist: context and tensor parallel sizes are 1.
    schedules.parallel_state.get_context_parallel_world_size = lambda: 1
    schedules.parallel_state.get_tensor_model_parallel_world_size = lambda: 1
    patch_p2p(schedules)
    write_json_lines(os.path.join(args.out, "megatron_order.json"), [run_case(schedules, *c) for c in CASES])
    write_json_lines(os.path.join(args.out, "megatron_layers.json"), layer_layouts(schedules, args.megatron))


if __name__ == "__main__":
    main()
