"""Float64 golden values of Megatron-LM main's HyperConnectionModule (mHC) for tests/model/hyper_connection_test.cc.

Runs Megatron's own megatron/core/transformer/hyper_connection.py (nothing is copied): MEGATRON_LM must
point to a Megatron-LM tree holding that file (main, 2026; e.g.
`git -C REPO show HEAD:megatron/core/transformer/hyper_connection.py > $MEGATRON_LM/megatron/core/transformer/hyper_connection.py`).
Its few imports are stubbed as megatron_stubs.py does for the tokenizer: MegatronModule is a plain
torch.nn.Module, the checkpoint manager is unused (no recomputation), nvtx ranges and torch.compile
are no-ops (torch 1.13), and get_bias_dropout_add is Megatron's unfused bias-dropout-add
(residual + dropout(x + bias)) at dropout 0.

Per case: a module over n streams of hidden size H with random mapping_proj, alphas and bias; an
input X [s, b, n·H]; the sub-block between the module's two halves is y = a ⊙ g (+ bias_f, the
sub-block's bias, handed to the fused bias-dropout-add as Megatron's layers do); the loss is
Σ out ⊙ R. Written: the inputs, h_pre, h_post, h_res, a, out, and the gradients of X, mapping_proj,
the alphas and the bias. Run: MEGATRON_LM=... /usr/bin/python3 tools/reference/mhc_reference.py OUT.json
"""
import contextlib
import json
import os
import sys
import types

import torch


def install():
    root = os.environ.get("MEGATRON_LM")
    if not root:
        sys.exit("set MEGATRON_LM to a Megatron-LM tree holding megatron/core/transformer/hyper_connection.py")
    if not hasattr(torch, "compile"):
        torch.compile = lambda f: f
    torch.cuda.nvtx.range = lambda *a, **k: contextlib.nullcontext()

    def stub(name, path=True):
        m = types.ModuleType(name)
        if path:
            m.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = m
        return m

    for name in ["megatron", "megatron.core", "megatron.core.transformer", "megatron.core.tensor_parallel",
                 "megatron.core.fusions"]:
        stub(name)
    rnd = stub("megatron.core.tensor_parallel.random", False)
    rnd.CheckpointWithoutOutputManager = object
    mod = stub("megatron.core.transformer.module", False)

    class MegatronModule(torch.nn.Module):
        def __init__(self, config):
            super().__init__()
            self.config = config

    mod.MegatronModule = MegatronModule
    tc = stub("megatron.core.transformer.transformer_config", False)
    tc.TransformerConfig = object
    utils = stub("megatron.core.utils", False)
    utils.nvtx_decorator = lambda message=None: (lambda f: f)
    fbd = stub("megatron.core.fusions.fused_bias_dropout", False)

    def get_bias_dropout_add(training, fused):
        def bda(x_with_bias, residual, prob):
            x, bias = x_with_bias
            if bias is not None:
                x = x + bias
            return residual + torch.nn.functional.dropout(x, p=prob, training=training)
        return bda

    fbd.get_bias_dropout_add = get_bias_dropout_add
    import megatron.core.transformer.hyper_connection as hc  # noqa: E402
    return hc


def case(hc, seed, n, H, s, b, iterations, alpha):
    torch.manual_seed(seed)
    cfg = types.SimpleNamespace(mhc_num_residual_streams=n, hidden_size=H, mhc_sinkhorn_iterations=iterations,
                                mhc_init_gating_factor=alpha, perform_initialization=True, sequence_parallel=False)
    m = hc.HyperConnectionModule(cfg, layer_number=1).double()
    with torch.no_grad():  # alphas and bias away from their init so that every term matters
        m.alpha_pre.fill_(alpha)
        m.alpha_post.fill_(alpha * 1.5)
        m.alpha_res.fill_(alpha * 2.0)
        m.bias.copy_(torch.randn(n * n + 2 * n, dtype=torch.float64) * 0.5)
    x = torch.randn(s, b, n * H, dtype=torch.float64, requires_grad=True)
    g = torch.randn(H, dtype=torch.float64)
    bias_f = torch.randn(H, dtype=torch.float64) * 0.1
    R = torch.randn(s, b, n * H, dtype=torch.float64)
    a, h_res, h_post = m(x)
    h_pre = m.compute_mappings(x)[0]
    y = a * g
    out = m.fused_h_res_h_post_bda(h_res, x, h_post, (y, bias_f), 0.0, True, False)
    (out * R).sum().backward()
    flat = lambda t: t.detach().reshape(-1).tolist()
    return {
        "n": n, "H": H, "s": s, "b": b, "iterations": iterations,
        "mapping_proj": flat(m.mapping_proj.weight), "alpha_pre": m.alpha_pre.item(),
        "alpha_post": m.alpha_post.item(), "alpha_res": m.alpha_res.item(), "bias": flat(m.bias),
        "x": flat(x), "g": flat(g), "bias_f": flat(bias_f), "R": flat(R),
        "h_pre": flat(h_pre), "h_post": flat(h_post), "h_res": flat(h_res), "a": flat(a), "out": flat(out),
        "d_x": flat(x.grad), "d_mapping_proj": flat(m.mapping_proj.weight.grad),
        "d_alpha_pre": m.alpha_pre.grad.item(), "d_alpha_post": m.alpha_post.grad.item(),
        "d_alpha_res": m.alpha_res.grad.item(), "d_bias": flat(m.bias.grad),
    }


def main():
    hc = install()
    cases = [case(hc, 1, 4, 8, 3, 2, 20, 0.3), case(hc, 2, 3, 5, 2, 3, 5, 0.8), case(hc, 3, 2, 6, 4, 1, 1, 1.0)]
    with open(sys.argv[1], "w") as f:
        json.dump({"source": "Megatron-LM main megatron/core/transformer/hyper_connection.py, float64",
                   "cases": cases}, f)


if __name__ == "__main__":
    main()
