"""Import Megatron-LM's tokenizer and dataset-writing code without its heavy package __init__ files.

Used by the reference scripts in this folder. MEGATRON_LM must point to a Megatron-LM checkout at
tag core_v0.12.1. Only Megatron's own modules are run (nothing is copied): the package modules
`megatron`, `megatron.core`, ... are replaced by empty namespace packages so that importing
megatron/training/tokenizer/tokenizer.py or megatron/core/datasets/indexed_dataset.py does not
pull in the model code, and the single helper preprocess_data.py needs from arguments.py
(_add_tokenizer_args) is loaded on its own.
"""
import ast
import os
import runpy
import sys
import types


def root():
    r = os.environ.get("MEGATRON_LM")
    if not r:
        sys.exit("set MEGATRON_LM to a Megatron-LM checkout at tag core_v0.12.1")
    return r


def install():
    """Registers the stub packages; returns megatron.training.tokenizer.tokenizer."""
    r = root()
    if "megatron.training.tokenizer.tokenizer" in sys.modules:
        return sys.modules["megatron.training.tokenizer.tokenizer"]

    def stub(name):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(r, *name.split("."))]
        sys.modules[name] = m
        return m

    for name in ["megatron", "megatron.core", "megatron.core.datasets", "megatron.training", "megatron.training.tokenizer"]:
        stub(name)
    sys.modules["megatron.training"].print_rank_0 = lambda *a, **k: None  # CustomTikTokenizer imports it from there
    utils = types.ModuleType("megatron.training.utils")
    utils.print_rank_0 = lambda *a, **k: None
    sys.modules[utils.__name__] = utils
    mm = types.ModuleType("megatron.training.tokenizer.multimodal_tokenizer")
    mm.MultimodalTokenizer = object
    sys.modules[mm.__name__] = mm
    cu = types.ModuleType("megatron.core.utils")
    cu.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules[cu.__name__] = cu
    ps = types.ModuleType("megatron.core.parallel_state")  # datasets only ask for the virtual pipeline rank
    ps.get_virtual_pipeline_model_parallel_rank = lambda: None
    sys.modules[ps.__name__] = ps
    import megatron.training.tokenizer.tokenizer as T  # noqa: E402
    sys.modules["megatron.training.tokenizer"].build_tokenizer = T.build_tokenizer
    src = open(os.path.join(r, "megatron", "training", "arguments.py")).read()
    fn = [n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_add_tokenizer_args"][0]
    args_mod = types.ModuleType("megatron.training.arguments")
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "arguments.py", "exec"), args_mod.__dict__)
    sys.modules[args_mod.__name__] = args_mod
    return T


def run_preprocess_data(argv):
    """Runs Megatron's tools/preprocess_data.py with the given arguments (in this process)."""
    install()
    script = os.path.join(root(), "tools", "preprocess_data.py")
    saved = sys.argv
    sys.argv = [script] + list(argv)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved


if __name__ == "__main__":
    # python megatron_stubs.py preprocess_data.py-arguments...
    run_preprocess_data(sys.argv[1:])
