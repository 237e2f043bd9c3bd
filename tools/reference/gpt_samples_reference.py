#!/usr/bin/env python3
"""Golden training samples from Megatron's own dataset code (core_v0.12.1), end to end.

Builds small .bin/.idx datasets with Megatron's IndexedDatasetBuilder, then for several flag
sets builds the train/valid/test datasets the way pretrain_gpt does (BlendedMegatronDatasetBuilder
with GPTDataset or MockGPTDataset, sizes from train-iters/global-batch/eval-interval/eval-iters)
and records a few samples of each split (tokens, labels, loss mask, position ids and, for
--reset-attention-mask, the first visible column of every attention-mask row).

Writes tests/data/reference/samples/{a,b,c}.bin/.idx and golden.json. Same environment as
tokenizer_reference.py, plus Megatron's helpers.cpp compiled in place:
  (cd $MEGATRON_LM/megatron/core/datasets && g++ -O3 -shared -std=c++11 -fPIC \\
     $(/tmp/megvenv/bin/python -m pybind11 --includes) helpers.cpp -o helpers_cpp$(python3-config --extension-suffix))
  MEGATRON_LM=... /tmp/megvenv/bin/python tools/reference/gpt_samples_reference.py
"""
import json
import os
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "tests", "data", "reference", "samples")
sys.path.insert(0, HERE)
import megatron_stubs  # noqa: E402

T = megatron_stubs.install()
import numpy  # noqa: E402
from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder  # noqa: E402
from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig, MockGPTDataset  # noqa: E402
from megatron.core.datasets.indexed_dataset import DType, IndexedDatasetBuilder  # noqa: E402

GPT2 = os.path.join(REPO, "data", "tokenizers", "gpt2")
EOD = 50256


def write_corpus(name, n_docs, rng):
    """Documents of 1-4 sequences with lengths 1..60; every document ends with EOD."""
    prefix = os.path.join(OUT, name)
    b = IndexedDatasetBuilder(prefix + ".bin", dtype=DType.optimal_dtype(50257))
    for _ in range(n_docs):
        lens = [int(x) for x in rng.randint(1, 60, size=int(rng.randint(1, 5)))]
        toks = [int(x) for x in rng.randint(0, 50256, size=sum(lens))]
        toks[-1] = EOD
        b.add_document(toks, lens)
    b.finalize(prefix + ".idx")
    return prefix


def get_blend(entries):
    from megatron.core.datasets.utils import get_blend_from_list
    return get_blend_from_list(entries)


def build(flags, tokenizer):
    seq = flags["seq_length"]
    gbs = flags["global_batch_size"]
    train_iters = flags["train_iters"]
    eval_interval = flags.get("eval_interval", 1000)
    eval_iters = flags.get("eval_iters", 100)
    sizes = [train_iters * gbs, (train_iters // eval_interval + 1) * eval_iters * gbs, eval_iters * gbs]
    blend = blend_per_split = None
    split = flags.get("split")
    if "data_path" in flags:
        blend = get_blend(flags["data_path"])
        split = split or "969, 30, 1"
    elif "per_split" in flags:
        blend_per_split = [get_blend(flags["per_split"][k]) if flags["per_split"].get(k) else None for k in ["train", "valid", "test"]]
    config = GPTDatasetConfig(
        random_seed=flags.get("seed", 1234), sequence_length=seq, blend=blend, blend_per_split=blend_per_split,
        split=split, path_to_cache=None, tokenizer=tokenizer, reset_position_ids=flags.get("reset_position_ids", False),
        reset_attention_mask=flags.get("reset_attention_mask", False), eod_mask_loss=flags.get("eod_mask_loss", False),
        create_attention_mask=True)
    cls = MockGPTDataset if flags.get("mock_data") else GPTDataset
    return BlendedMegatronDatasetBuilder(cls, sizes, lambda: True, config).build(), sizes


def sample_record(ds, k):
    s = ds[k]
    mask = s["attention_mask"][0].numpy()  # True = masked
    attn_start = [int(numpy.argmin(mask[i, : i + 1])) for i in range(mask.shape[0])]
    return {"index": k, "tokens": s["tokens"].tolist(), "labels": s["labels"].tolist(),
            "loss_mask": [int(x) for x in s["loss_mask"].tolist()], "position_ids": s["position_ids"].tolist(),
            "attn_start": attn_start}


def gale_flags(f):
    """The same run as `gale pretrain`/`gale data-samples` flags."""
    out = ["--seq-length", str(f["seq_length"]), "--micro-batch-size", "1", "--global-batch-size", str(f["global_batch_size"]),
           "--train-iters", str(f["train_iters"]), "--eval-interval", str(f.get("eval_interval", 1000)),
           "--eval-iters", str(f.get("eval_iters", 100)), "--seed", str(f.get("seed", 1234))]
    if "data_path" in f:
        out += ["--data-path"] + f["data_path"]
    if "per_split" in f:
        for k in ["train", "valid", "test"]:
            if f["per_split"].get(k):
                out += [f"--{k}-data-path"] + f["per_split"][k]
    if f.get("split"):
        out += ["--split", f["split"]]
    if f.get("mock_data"):
        out += ["--mock-data", "--vocab-size", str(f["vocab_size"])]
    else:
        out += ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", "@GPT2@/vocab.json", "--merge-file", "@GPT2@/merges.txt"]
    for flag in ["eod_mask_loss", "reset_position_ids", "reset_attention_mask"]:
        if f.get(flag):
            out.append("--" + flag.replace("_", "-"))
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    rng = numpy.random.RandomState(99)
    write_corpus("a", 300, rng)
    write_corpus("b", 70, rng)
    write_corpus("c", 25, rng)
    a, b, c = ("@SAMPLES@/a", "@SAMPLES@/b", "@SAMPLES@/c")
    gpt2 = megatron_stubs_tokenizer("GPT2BPETokenizer")
    scenarios = {
        "single_default_split": dict(data_path=[a], seq_length=32, global_batch_size=4, train_iters=30, eval_interval=10, eval_iters=2),
        "single_many_epochs_flags": dict(data_path=[a], split="90,8,2", seq_length=16, global_batch_size=8, train_iters=200,
                                         eval_interval=50, eval_iters=3, seed=7, eod_mask_loss=True, reset_position_ids=True,
                                         reset_attention_mask=True),
        "weighted_blend": dict(data_path=["0.3", a, "0.7", b], split="98,2,0", seq_length=24, global_batch_size=5,
                               train_iters=40, eval_interval=20, eval_iters=2, seed=4242),
        "unweighted_blend": dict(data_path=[a, b, c], split="80,20,0", seq_length=20, global_batch_size=2, train_iters=30,
                                 eval_interval=100, eval_iters=4),
        "per_split": dict(per_split={"train": ["2", a, "1", c], "valid": [b], "test": [c]}, seq_length=32, global_batch_size=3,
                          train_iters=50, eval_interval=25, eval_iters=2, seed=5),
        "mock": dict(mock_data=True, vocab_size=5000, seq_length=64, global_batch_size=4, train_iters=25, eval_interval=10, eval_iters=2),
    }
    golden = {"generator": "tools/reference/gpt_samples_reference.py (Megatron core_v0.12.1 datasets)", "scenarios": {}}
    cwd = os.getcwd()
    for name, f in scenarios.items():
        real = json.loads(json.dumps(f).replace("@SAMPLES@", OUT))
        if real.get("mock_data"):
            tok = megatron_stubs_tokenizer("NullTokenizer", vocab_size=real["vocab_size"])
        else:
            tok = gpt2
        (train, valid, test), sizes = build(real, tok)
        entry = {"flags": gale_flags(f), "sizes": sizes, "splits": {}}
        for split, ds in [("train", train), ("valid", valid), ("test", test)]:
            if ds is None:
                entry["splits"][split] = None
                continue
            n = len(ds)
            picks = sorted(set([0, 1, 2, 3, n // 2, n - 2, n - 1] + [int(x) for x in rng.randint(0, n, size=3)]))
            entry["splits"][split] = {"size": n, "samples": [sample_record(ds, k) for k in picks if 0 <= k < n]}
        golden["scenarios"][name] = entry
        print(name, {k: (v["size"] if v else None) for k, v in entry["splits"].items()}, file=sys.stderr)
    os.chdir(cwd)
    import shutil
    for name in ["a", "b", "c"]:  # Megatron's default index cache, PREFIX/cache/GPTDataset_indices
        shutil.rmtree(os.path.join(OUT, name), ignore_errors=True)
    with open(os.path.join(OUT, "golden.json"), "w") as fo:
        json.dump(golden, fo, separators=(",", ":"))
        fo.write("\n")
    print("wrote", OUT, file=sys.stderr)


def megatron_stubs_tokenizer(kind, **kw):
    class Args:
        rank = 1
        make_vocab_size_divisible_by = 128
        tensor_model_parallel_size = 1
        vocab_extra_ids = 0
        vocab_file = os.path.join(GPT2, "vocab.json")
        merge_file = os.path.join(GPT2, "merges.txt")
        tokenizer_model = None
        vocab_size = None
    a = Args()
    a.tokenizer_type = kind
    for k, v in kw.items():
        setattr(a, k, v)
    return T.build_tokenizer(a)


if __name__ == "__main__":
    main()
