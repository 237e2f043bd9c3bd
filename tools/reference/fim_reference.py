#!/usr/bin/env python3
"""Golden FIM samples from Megatron-LM's own GPTFIMDataset code (megatron/training/datasets/fim_dataset.py).

Megatron's module is loaded unchanged, with its tokenizer library class HuggingFaceTokenizer
(megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py, over transformers); only its base
class GPTDataset is a stub here, which hands GPTFIMDataset the raw GPT samples (each sample one
"document" read whole through sample_index / document_index / dataset.get). The raw samples are
Gale's (`gale data-samples` without --fim-data), whose GPT sample order is checked against
Megatron's own GPTDataset elsewhere (tools/reference/gpt_samples_reference.py); they are recorded
in the fixture, and the C++ test checks that Gale still reads them.

Data loader streams as in Megatron's pretrain: one dataset per split and data-parallel rank, copied
into each of --num-workers workers, the rank's micro-batch m read by worker m mod W (W = 0: the main
process).

Setup (numpy 1.26, transformers 5; Megatron-LM at a commit with fim_dataset.py, e.g. the mirror's HEAD):
  python3 -m venv /tmp/fim_venv && /tmp/fim_venv/bin/pip install numpy==1.26.4 transformers
  mkdir -p /tmp/meg_fim && git -C $MEGATRON_GIT archive HEAD megatron/training/datasets/fim_dataset.py \\
      megatron/core/tokenizers/text/libraries/huggingface_tokenizer.py \\
      megatron/core/tokenizers/text/libraries/abstract_tokenizer.py | tar -x -C /tmp/meg_fim
  build/bin/gale preprocess --input tests/data/fim/corpus.jsonl --output-prefix tests/data/fim/corpus \\
      --tokenizer-type HuggingFaceTokenizer --tokenizer-model tests/data/fim --append-eod --workers 1
  MEGATRON_LM=/tmp/meg_fim /tmp/fim_venv/bin/python tools/reference/fim_reference.py
Writes tests/data/fim/golden.json.

Case psm_spm (one stream read in order, one sample per micro-batch) is also the reference for
--iterations-to-skip (Megatron's dummy_train_step reads the skipped micro-batches through the same
loader, so after skipping k samples the next is fim[k]) and for virtual pipeline stages (the
first- and last-stage chunks each build a dataset with a fresh RandomState(seed) and read the
micro-batches in order, so both give fim[0], fim[1], ...): tests/cli/fim_cli_test.cc.
"""
import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
import types

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
DATA = os.path.join(REPO, "tests", "data", "fim")
GALE = os.path.join(REPO, "build", "bin", "gale")
MEG = os.environ.get("MEGATRON_LM") or sys.exit("set MEGATRON_LM (see the docstring)")


def load(name, path, package=None):
    spec = importlib.util.spec_from_file_location(name, path)
    m = importlib.util.module_from_spec(spec)
    if package:
        m.__package__ = package
    sys.modules[name] = m
    spec.loader.exec_module(m)
    return m


def install_stubs():
    for name in ["megatron", "megatron.core", "megatron.core.datasets", "megatron.core.tokenizers",
                 "megatron.core.tokenizers.text", "megatron.core.tokenizers.text.libraries",
                 "megatron.training", "megatron.training.datasets"]:
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(MEG, *name.split("."))]
        sys.modules[name] = m
    cu = types.ModuleType("megatron.core.utils")
    cu.log_single_rank = lambda logger, level, *a, **k: None
    sys.modules[cu.__name__] = cu

    # The stub base class: GPTFIMDataset only reads config, shuffle_index, sample_index,
    # document_index and dataset.get from it.
    gd = types.ModuleType("megatron.core.datasets.gpt_dataset")

    @dataclasses.dataclass
    class GPTDatasetConfig:
        random_seed: int = 1234
        tokenizer: object = None

    class GPTDataset:
        def __init__(self, indexed_dataset, dataset_path, indexed_indices, num_samples, index_split, config):
            self.dataset = indexed_dataset
            self.config = config
            n = len(indexed_dataset.samples)
            self.document_index = np.arange(n)
            self.sample_index = np.array([[i // 2, 0 if i % 2 == 0 else len(indexed_dataset.samples[i // 2]) - 1]
                                          for i in range(2 * n)])
            self.shuffle_index = np.arange(0, 2 * n, 2)

    gd.GPTDataset, gd.GPTDatasetConfig = GPTDataset, GPTDatasetConfig
    sys.modules[gd.__name__] = gd
    ix = types.ModuleType("megatron.core.datasets.indexed_dataset")
    ix.IndexedDataset = object
    sys.modules[ix.__name__] = ix
    ut = types.ModuleType("megatron.core.datasets.utils")
    ut.Split = object
    sys.modules[ut.__name__] = ut
    lib = "megatron.core.tokenizers.text.libraries"
    load(lib + ".abstract_tokenizer", os.path.join(MEG, *lib.split("."), "abstract_tokenizer.py"), lib)
    hf = load(lib + ".huggingface_tokenizer", os.path.join(MEG, *lib.split("."), "huggingface_tokenizer.py"), lib)
    fim = load("megatron.training.datasets.fim_dataset",
               os.path.join(MEG, "megatron", "training", "datasets", "fim_dataset.py"), "megatron.training.datasets")
    return hf.HuggingFaceTokenizer, fim.GPTFIMDataset, fim.GPTFIMDatasetConfig


class Samples:
    """The raw samples as an indexed dataset of one document each."""

    def __init__(self, samples):
        self.samples = [np.array(s, dtype=np.int64) for s in samples]

    def get(self, idx, offset=0, length=None):
        s = self.samples[idx]
        return s[offset:] if length is None else s[offset:offset + length]


def gale_raw_samples(flags, count):
    out = subprocess.run([GALE, "data-samples"] + flags + ["--sample-split", "train", "--sample-index", "0",
                                                             "--sample-count", str(count)],
                         check=True, capture_output=True, text=True).stdout
    return [json.loads(line)["ids"] for line in out.splitlines() if line.strip()]


BASE = ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", "tests/data/fim",
        "--data-path", "tests/data/fim/corpus_text_document", "--split", "100,0,0", "--seq-length", "48",
        "--max-position-embeddings", "48", "--train-iters", "16", "--eval-iters", "0", "--num-layers", "1",
        "--hidden-size", "8", "--num-attention-heads", "1"]

CASES = [
    # name, FIM settings, seed, micro-batch size, workers, samples, data-parallel size
    ("psm_spm", dict(fim_rate=0.9, fim_spm_rate=0.5), 1234, 1, 0, 16, 1),
    ("split_sample", dict(fim_rate=0.8, fim_spm_rate=0.4, fim_split_sample="<|im_start|>", fim_fragment_rate=0.6),
     77, 1, 0, 16, 1),
    ("no_prefix", dict(fim_rate=1.0, fim_spm_rate=0.3, fim_no_prefix="# note"), 5, 1, 0, 16, 1),
    ("workers", dict(fim_rate=0.7, fim_spm_rate=0.6), 42, 2, 2, 16, 1),
    ("dp2", dict(fim_rate=0.9, fim_spm_rate=0.5), 1234, 1, 0, 8, 2),
]


def flags_of(settings):
    f = []
    for k, v in settings.items():
        f += ["--" + k.replace("_", "-"), str(v)]
    return f


def main():
    HuggingFaceTokenizer, GPTFIMDataset, GPTFIMDatasetConfig = install_stubs()
    lib = HuggingFaceTokenizer(DATA)
    tokenizer = types.SimpleNamespace(_tokenizer=lib)
    extra = {"prefix": "<fim_prefix>", "middle": "<fim_middle>", "suffix": "<fim_suffix>", "pad": "<fim_pad>",
             "eod": "<|endoftext|>"}
    os.chdir(REPO)
    cases = []
    for name, settings, seed, mbs, workers, count, dp in CASES:
        run_flags = BASE + ["--seed", str(seed), "--micro-batch-size", str(mbs), "--global-batch-size", str(mbs * dp)]
        raw = gale_raw_samples(run_flags, count)
        config = GPTFIMDatasetConfig(random_seed=seed, tokenizer=tokenizer, fim_rate=settings["fim_rate"],
                                     fim_spm_rate=settings["fim_spm_rate"], fim_extra_tokens=extra,
                                     fim_split_sample=settings.get("fim_split_sample"),
                                     fim_fragment_rate=settings.get("fim_fragment_rate"),
                                     fim_no_prefix=settings.get("fim_no_prefix"))
        # Megatron's MegatronPretrainingSampler: data-parallel rank r reads samples
        # [r*mbs, (r+1)*mbs) of every chunk of mbs*dp, its micro-batch m = k // (mbs*dp). Each rank
        # builds its own dataset, copied into each worker (torch's DataLoader forks them; one copy
        # in the main process without workers); worker m mod W reads micro-batch m.
        copies = [[GPTFIMDataset(Samples(raw), "corpus", None, count, None, config) for _ in range(max(1, workers))]
                  for _ in range(dp)]
        fim = [None] * count
        for rank in range(dp):
            for k in range(count):
                if (k // mbs) % dp != rank:
                    continue
                ds = copies[rank][(k // (mbs * dp)) % max(1, workers)]
                text, _, _ = ds._query_document_sample_shuffle_indices(k)
                fim[k] = [int(x) for x in text]
        cases.append({"name": name, "flags": run_flags + ["--num-workers", str(workers)] + flags_of(settings),
                      "seed": seed, "micro_batch_size": mbs, "num_workers": workers, "data_parallel_size": dp,
                      "settings": settings,
                      "raw": raw, "fim": fim})
    with open(os.path.join(DATA, "golden.json"), "w") as f:
        json.dump({"source": "Megatron-LM GPTFIMDataset (" + MEG + ")", "cases": cases}, f)
        f.write("\n")


if __name__ == "__main__":
    main()
