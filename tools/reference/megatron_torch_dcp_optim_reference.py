"""Tiny Megatron-LM `torch_dcp` checkpoints (--ckpt-format torch_dcp) that hold Adam's optimizer state.

Megatron's save_checkpoint with --ckpt-format torch_dcp calls torch.distributed.checkpoint.save on
generate_state_dict's dict, which for that format holds the plain optimizer.state_dict() (not the sharded one of
torch_dist): {'args', 'checkpoint_version', 'iteration', 'model': state_dict_for_save_checkpoint(), 'optimizer',
'opt_param_scheduler', 'num_floating_point_operations_so_far'}; DCP's planner flattens it into dotted keys
(optimizer.state.0.exp_avg, optimizer.param_groups.1.wd_mult, optimizer.fp32_from_fp16_params.0.3, ...), tensors as
tensors and every other leaf (a param group's 'params' list, the args Namespace) as a torch.save'd object.
Megatron allows the format only with --use-torch-fsdp2 at TP 1 x PP 1, which forbids the distributed optimizer, so
the optimizer is FP32Optimizer or Float16OptimizerWithFloat16Params (--bf16; FSDP2 forbids --fp16).
Writes, next to the legacy-format fixtures of megatron_torch_optim_reference.py (the same AdamW state, torch_optim.json):
  torch_dcp_adam/       torch_adam's rank file (Megatron core_v0.12.1's own FP32Optimizer.state_dict(), f32 weights)
                        saved as torch_dcp does, args ckpt_format 'torch_dcp', use_torch_fsdp2 True
  torch_dcp_adam_bf16/  the same state as Megatron core_v0.12.1's own Float16OptimizerWithFloat16Params.state_dict() at
                        TP 1 (megatron_torch_optim_reference.worker in 'float16' mode, one gloo process), bf16 weights
The saving run here is one process without FSDP2: FSDP2's DTensor shards are written as chunks of the same global
tensors under the same keys, which a reader assembles; the flattening of the state dict is the same.
Checks: each directory loaded back with torch.distributed.checkpoint.load into the rank file's structure gives
every tensor bit for bit.
Run in two steps (step 1: Debian's torch 1.13 with PyPI packaging, as megatron_torch_optim_reference.py; step 2: a
torch >= 2.4 with torch.distributed.checkpoint):
  PYTHONPATH=/path/to/packaging MEGATRON_LM=/tmp/meg PYTORCH_JIT=0 /usr/bin/python3 \
    tools/reference/megatron_torch_dcp_optim_reference.py legacy tests/data/megatron /tmp/dcp_work
  python3 tools/reference/megatron_torch_dcp_optim_reference.py dcp tests/data/megatron /tmp/dcp_work
"""
import copy
import os
import shutil
import sys

ITERATION = 7


def rank_file(d):
    return os.path.join(d, "iter_%07d" % ITERATION, "mp_rank_00", "model_optim_rng.pt")


def legacy(fixtures, work):
    """Step 1: torch_adam's state as Float16OptimizerWithFloat16Params.state_dict() at TP 1 (a legacy rank file)."""
    import torch
    import torch.distributed as dist
    import torch.multiprocessing as mp
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    import megatron_torch_dist_optim_reference as oref
    import megatron_torch_optim_reference as toref
    model, opt, sched = oref.train_adamw()
    state = oref.global_state(model, opt.optimizer)
    sched_sd = sched.state_dict()
    group_values = {g["wd_mult"]: (g["lr"], g["weight_decay"]) for g in opt.optimizer.param_groups}
    dist.destroy_process_group()
    # The same run as the committed torch_adam fixture: its moments bit for bit.
    saved = torch.load(rank_file(os.path.join(fixtures, "torch_adam")), map_location="cpu")["optimizer"]["state"]
    mine = opt.state_dict()["state"]
    for i, s in saved.items():
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(s[k], mine[i][k]), (i, k)
    out = os.path.join(work, "torch_adam_bf16_tp1")
    shutil.rmtree(out, ignore_errors=True)
    mp.spawn(toref.worker, args=(1, out, 31000 + os.getpid() % 2000, state, sched_sd, group_values, "float16", 1, 1),
             nprocs=1, join=True)
    print("wrote", rank_file(out))


def equal_tree(a, b, path=""):
    import torch
    if torch.is_tensor(a):
        assert torch.is_tensor(b) and a.dtype == b.dtype and torch.equal(a, b), path
    elif isinstance(a, dict):
        assert set(a) == set(b), path
        for k in a:
            equal_tree(a[k], b[k], "%s.%s" % (path, k))
    elif isinstance(a, list):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            equal_tree(x, y, "%s.%d" % (path, i))


def zeroed(tree):
    import torch
    if torch.is_tensor(tree):
        return torch.zeros_like(tree)
    if isinstance(tree, dict):
        return {k: zeroed(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [zeroed(v) for v in tree]
    return copy.deepcopy(tree)


def save_dcp(fixtures, work):
    """Step 2: each rank file's dict saved as Megatron's torch_dcp save does, then loaded back and compared."""
    import torch
    import torch.distributed.checkpoint as dcp
    for name, src in (("torch_dcp_adam", rank_file(os.path.join(fixtures, "torch_adam"))),
                      ("torch_dcp_adam_bf16", rank_file(os.path.join(work, "torch_adam_bf16_tp1")))):
        root = torch.load(src, map_location="cpu", weights_only=False)
        root["args"].ckpt_format = "torch_dcp"
        root["args"].use_torch_fsdp2 = True
        out = os.path.join(fixtures, name)
        shutil.rmtree(out, ignore_errors=True)
        ckpt = os.path.join(out, "iter_%07d" % ITERATION)
        os.makedirs(ckpt)
        keys = ("args", "checkpoint_version", "iteration", "model", "optimizer", "opt_param_scheduler",
                "num_floating_point_operations_so_far")
        sd = {k: root[k] for k in keys}
        dcp.save(state_dict=sd, storage_writer=dcp.FileSystemWriter(ckpt))
        with open(os.path.join(out, "latest_checkpointed_iteration.txt"), "w") as f:
            f.write(str(ITERATION))
        back = {"model": zeroed(root["model"]), "optimizer": zeroed(root["optimizer"])}
        dcp.load(state_dict=back, storage_reader=dcp.FileSystemReader(ckpt))
        equal_tree(root["model"], back["model"], "model")
        equal_tree(root["optimizer"], back["optimizer"], "optimizer")
        print("wrote", out, "; torch.distributed.checkpoint.load gives its model and optimizer tensors bit for bit")


def main():
    step, fixtures, work = sys.argv[1:4]
    os.makedirs(work, exist_ok=True)
    if step == "legacy":
        legacy(fixtures, work)
    else:
        save_dcp(fixtures, work)


if __name__ == "__main__":
    main()
