#!/usr/bin/env python3
"""Golden values for --mid-level-dataset-surplus, --per-dataset-sequences-path and
--allow-ambiguous-pad-tokens from Megatron-LM main's own dataset code.

Runs megatron/core/datasets (BlendedMegatronDatasetBuilder, GPTDataset, BlendedDataset,
IndexedDataset, helpers.cpp) of a Megatron-LM main checkout on the committed corpora
tests/data/reference/samples/{a,b,c} (written by gpt_samples_reference.py) and writes
tests/data/reference/samples/main_data_flags.json:

  * "surplus": for one weighted blend and several mid_level_dataset_surplus values, the size
    of each split, the samples each mid-level GPTDataset was built with, and the tokens of every
    training and validation sample (its first HEAD tokens: the sample order a non-default surplus
    gives differs from the default's);
  * "sequences_per_dataset": the JSON Megatron's tools/build_sequences_per_dataset.py writes for
    the three corpora ({prefix: [sequence_count, document_count]}, read with _IndexReader as that
    tool does), and the first training samples built with it (equal to those built without it);
  * "pad": the pad id GPTDataset keeps for a tokenizer whose pad equals its eod, with and
    without allow_ambiguous_pad_tokens, and the labels/loss mask of one sample under each.

Only Megatron's modules run; its package __init__ files are replaced by namespace stubs and the
four helpers it imports from outside megatron/core/datasets (log_single_rank, safe_numpy_load, the
tokenizer base class, the multi-storage-client switch) by trivial stand-ins. Environment: Debian's
python3 (numpy, torch 1.13) plus pybind11 to compile helpers.cpp in place:
  (cd $MEGATRON_MAIN/megatron/core/datasets && g++ -O2 -shared -std=c++17 -fPIC \\
     $(python3 -m pybind11 --includes) helpers.cpp -o helpers_cpp$(python3-config --extension-suffix))
  MEGATRON_MAIN=/path/to/Megatron-LM python3 tools/reference/megatron_main_data_flags_reference.py
(generated from Megatron-LM main at d98e8a64ddf34856e74b24714e3bedb2f5a39553).
"""
import json
import logging
import os
import sys
import types
import warnings

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SAMPLES = os.path.join(REPO, "tests", "data", "reference", "samples")
EOD = 50256
HEAD = 3  # tokens recorded per sample: enough to tell the samples' order apart


def install_stubs(root):
    def package(name):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = m

    for name in ["megatron", "megatron.core", "megatron.core.datasets"]:
        package(name)
    utils = types.ModuleType("megatron.core.utils")
    utils.log_single_rank = lambda logger, level, *a, **k: logger.log(level, *a, **k)
    sys.modules[utils.__name__] = utils
    safe = types.ModuleType("megatron.core.safe_globals")
    safe.safe_numpy_load = numpy.load
    sys.modules[safe.__name__] = safe
    tok = types.ModuleType("megatron.core.tokenizers")
    tok.MegatronTokenizerBase = object
    sys.modules[tok.__name__] = tok
    msc = types.ModuleType("megatron.core.msc_utils")

    class Feature:
        @staticmethod
        def is_enabled():
            return False

    msc.MultiStorageClientFeature = Feature
    msc.maybe_msc = types.SimpleNamespace(open=open)
    sys.modules[msc.__name__] = msc


class Tokenizer:
    """The special ids GPTDataset reads: eod, eos, pad (absent when pad is None), vocab_size."""

    def __init__(self, pad=None):
        self.eod = EOD
        self.eos = EOD
        self.vocab_size = 50257
        self.unique_identifiers = {"class": "GPT2BPETokenizer"}
        if pad is not None:
            self.pad = pad


def build(prefix_entries, split, sizes, seed, seq, tokenizer, **config):
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    cfg = GPTDatasetConfig(random_seed=seed, sequence_length=seq, blend=get_blend_from_list(prefix_entries),
                           split=split, path_to_cache=None, tokenizer=tokenizer, reset_position_ids=False,
                           reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False, **config)
    return BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, cfg).build()


def main():
    install_stubs(os.environ.get("MEGATRON_MAIN") or sys.exit("set MEGATRON_MAIN to a Megatron-LM main checkout"))
    logging.disable(logging.WARNING)
    a, b, c = (os.path.join(SAMPLES, n) for n in "abc")
    rel = {a: "@SAMPLES@/a", b: "@SAMPLES@/b", c: "@SAMPLES@/c"}
    # pretrain_gpt's sizes for --train-iters 40 --global-batch-size 5 --eval-interval 20 --eval-iters 2.
    seq, gbs, iters, eval_interval, eval_iters, seed = 24, 5, 40, 20, 2, 4242
    sizes = [iters * gbs, (iters // eval_interval + 1) * eval_iters * gbs, eval_iters * gbs]
    entries = ["0.3", a, "0.7", b]
    out = {"generator": "tools/reference/megatron_main_data_flags_reference.py (Megatron-LM main "
                        "d98e8a64ddf34856e74b24714e3bedb2f5a39553 datasets)",
           "flags": ["--seq-length", str(seq), "--micro-batch-size", "1", "--global-batch-size", str(gbs),
                     "--train-iters", str(iters), "--eval-interval", str(eval_interval), "--eval-iters",
                     str(eval_iters), "--seed", str(seed), "--split", "98,2,0", "--tokenizer-type",
                     "GPT2BPETokenizer", "--vocab-file", "@GPT2@/vocab.json", "--merge-file", "@GPT2@/merges.txt",
                     "--data-path", "0.3", "@SAMPLES@/a", "0.7", "@SAMPLES@/b"],
           "surplus": []}
    for surplus in [0.005, 0.0, 1.0, 2.5]:
        train, valid, test = build(entries, "98,2,0", sizes, seed, seq, Tokenizer(), mid_level_dataset_surplus=surplus)
        rec = {"surplus": surplus, "train_size": len(train), "valid_size": len(valid),
               "train_mid_level_samples": [len(d) for d in train.datasets],
               "valid_mid_level_samples": [len(d) for d in valid.datasets],
               "train_heads": [train[k]["tokens"][:HEAD].tolist() for k in range(len(train))],
               "valid_heads": [valid[k]["tokens"][:HEAD].tolist() for k in range(len(valid))]}
        out["surplus"].append(rec)
        print("surplus", surplus, rec["train_mid_level_samples"], rec["valid_mid_level_samples"], file=sys.stderr)
    # A negative surplus can leave a mid-level dataset short: Megatron's BlendedDataset refuses.
    try:
        build(entries, "98,2,0", sizes, seed, seq, Tokenizer(), mid_level_dataset_surplus=-0.9)
        out["negative_surplus_error"] = None
    except IndexError as e:
        out["negative_surplus_error"] = str(e)
    print("negative:", out["negative_surplus_error"], file=sys.stderr)

    # tools/build_sequences_per_dataset.py: one _IndexReader per prefix, (sequence_count, document_count).
    from megatron.core.datasets.indexed_dataset import _IndexReader
    counts = {}
    for p in (a, b, c):
        r = _IndexReader(p + ".idx", False)
        counts[p] = (r.sequence_count, r.document_count)
    with_counts, _, _ = build(entries, "98,2,0", sizes, seed, seq, Tokenizer(), sequences_per_dataset=counts)
    out["sequences_per_dataset"] = {"json": {rel[k]: list(v) for k, v in counts.items()},
                                    "train_heads": [with_counts[k]["tokens"][:HEAD].tolist() for k in range(len(with_counts))]}

    # The pad id when the tokenizer's pad equals its eod.
    out["pad"] = {}
    for allow in [False, True]:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            train, _, _ = build(entries, "98,2,0", sizes, seed, seq, Tokenizer(pad=EOD), allow_ambiguous_pad_tokens=allow)
        ds = train.datasets[0]
        k = next(k for k in range(len(ds)) if EOD in ds[k]["labels"].tolist() or 0 in ds[k]["labels"].tolist())
        s = ds[k]  # sample k of the blend's first mid-level dataset (prefix a)
        out["pad"]["allow" if allow else "default"] = {
            "pad_token_id": int(ds._pad_token_id), "warnings": sorted({str(w.message) for w in caught}),
            "dataset": "a", "index": k, "tokens": s["tokens"].tolist(), "labels": s["labels"].tolist(),
            "loss_mask": [int(x) for x in s["loss_mask"].tolist()]}
    with open(os.path.join(SAMPLES, "main_data_flags.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print("wrote", os.path.join(SAMPLES, "main_data_flags.json"), file=sys.stderr)


if __name__ == "__main__":
    main()
