#!/usr/bin/env python3
"""Golden samples of Megatron-LM main's --sft dataset (SFTDataset + SFTTokenizer), run unchanged.

Megatron's own megatron/training/datasets/sft_dataset.py, megatron/core/tokenizers/text/libraries/
sft_tokenizer.py and BlendedMegatronDatasetBuilder (the split into per-split SFTDatasets) are
imported from a checkout of Megatron-LM main (commit d98e8a64, 2026-08-22) with its heavy package
modules stubbed (as megatron_stubs.py does for core_v0.12.1); Hugging Face `transformers` renders
the Jinja prompt templates and tokenizes, `datasets` reads the JSONL, as in Megatron.

Writes tests/data/megatron_sft/:
  tokenizer.json, tokenizer_config.json  tests/data/tokenizers/qwen2_style plus the added special
                                          tokens the prompt formats name (<SPECIAL_10>, <SPECIAL_11>,
                                          <SPECIAL_12>, <SPECIAL_233>, <unk>)
  conversations.jsonl                     20 lines of "messages" (the input; hand-written here)
  golden.json                             per configuration: the train/valid/test samples the
                                          builder's datasets return (tokens, labels, loss_mask,
                                          position_ids, cu_seqlens unpadded, max_seqlen), or the
                                          error Megatron raises for that sample

  git -C /work/.mirror/NVIDIA+Megatron-LM/repo archive d98e8a64 megatron | tar -x -C /tmp/meg_head
  MEGATRON_LM=/tmp/meg_head /tmp/sft_venv/bin/python tools/reference/megatron_sft_reference.py
(/tmp/sft_venv: `python3 -m venv --system-site-packages` of Debian's python3 with torch 1.13, plus
transformers 5.25, datasets 5.2, jinja2 and numpy 1.26 — torch 1.13 needs numpy < 2.) Deterministic: rerunning reproduces the committed bytes.
"""
import copy
import json
import os
import sys
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "tests", "data", "megatron_sft")

SYSTEM = "Answer briefly."
# One JSON line each. A new system message starts a new conversation within a line.
LINES = [
    [("system", SYSTEM), ("user", "What is the capital of France?"), ("assistant", "Paris.")],
    [("system", SYSTEM), ("user", "Name three primary colours."), ("assistant", "Red, yellow and blue."),
     ("user", "And the secondary ones?"), ("assistant", "Orange, green and purple.")],
    [("system", "Answer in one word."), ("user", "Opposite of hot?"), ("assistant", "Cold."),
     ("system", "Answer with a number."), ("user", "How many legs has a spider?"), ("assistant", "Eight.")],
    [("user", "No system message here. What is two plus two?"), ("assistant", "Four.")],
    [("system", "  Leading and trailing spaces are stripped.  "), ("user", "\n  Hello?  \n"),
     ("assistant", "  Hello to you.\n\n")],
    [("system", SYSTEM), ("user", "Who wrote Pride and Prejudice?"), ("assistant", "Jane Austen, in 1813.")],
    [("system", SYSTEM), ("user", "Quote the opening line of Pride and Prejudice."),
     ("assistant", "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
                   "must be in want of a wife. However little known the feelings or views of such a man may be "
                   "on his first entering a neighbourhood, this truth is so well fixed in the minds of the "
                   "surrounding families, that he is considered the rightful property of some one or other of "
                   "their daughters.")],
    [("system", SYSTEM), ("user", "Translate 'bonjour'."), ("assistant", "Good day.")],
    [("system", "/think Reason step by step."), ("user", "What is 12 times 12? /no_think"),
     ("assistant", "144.")],
    [("system", SYSTEM), ("user", "Look up the weather."), ("assistant", "Calling the tool."),
     ("tool", "Sunny, 21 degrees."), ("assistant", "It is sunny and 21 degrees.")],
    [("system", SYSTEM), ("user", "Is the sea salty?"), ("assistant", "Yes."), ("system", SYSTEM),
     ("user", "Is the sky green?"), ("assistant", "No, it is usually blue."), ("system", SYSTEM),
     ("user", "Do fish swim?"), ("assistant", "They do.")],
    [("system", SYSTEM), ("user", "Spell 'cat' backwards."), ("assistant", "tac")],
    [("system", SYSTEM), ("user", "Which is larger, 9 or 11?"), ("assistant", "11 is larger than 9.")],
    [("system", SYSTEM), ("user", "Give a synonym for happy."), ("assistant", "Cheerful.")],
    [("system", SYSTEM), ("user", "Who was Mr. Darcy's friend?"), ("assistant", "Mr. Bingley.")],
    [("system", SYSTEM), ("user", "Complete: Emma Woodhouse, handsome, clever, and ..."),
     ("assistant", "rich, with a comfortable home and happy disposition, seemed to unite some of the best "
                   "blessings of existence.")],
    [("system", SYSTEM), ("user", "What colour is grass?"), ("assistant", "Green.")],
    [("system", SYSTEM), ("user", "How many days are in a week?"), ("assistant", "Seven.")],
    [("system", SYSTEM), ("user", "Name a planet."), ("assistant", "Mars."), ("user", "Another?"),
     ("assistant", "Jupiter.")],
    [("system", SYSTEM), ("user", "Say nothing."), ("assistant", "")],  # Megatron: empty assistant turn
]
ADDED = ["<SPECIAL_10>", "<SPECIAL_11>", "<SPECIAL_12>", "<SPECIAL_233>", "<unk>"]
SEQ = 96
# name, prompt format, context-parallel size, split, (train, valid, test) sample counts
CONFIGS = [
    ("h_aligned", "nemotron-h-aligned", 1, "80,10,10", (24, 4, 2)),
    ("h_aligned_cp2", "nemotron-h-aligned", 2, "80,10,10", (24, 4, 2)),
    ("nano_v2", "nemotron-nano-v2", 1, "80,10,10", (24, 4, 2)),
    ("identity", "identity", 1, "80,10,10", (24, 4, 2)),
]


def write_inputs():
    os.makedirs(OUT, exist_ok=True)
    tok = json.load(open(os.path.join(REPO, "tests", "data", "tokenizers", "qwen2_style", "tokenizer.json")))
    next_id = max(t["id"] for t in tok["added_tokens"]) + 1
    for content in ADDED:
        tok["added_tokens"].append({"id": next_id, "content": content, "single_word": False, "lstrip": False,
                                    "rstrip": False, "normalized": False, "special": True})
        next_id += 1
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump(tok, f, ensure_ascii=False, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "unk_token": "<unk>"},
                  f, indent=1)
        f.write("\n")
    with open(os.path.join(OUT, "conversations.jsonl"), "w") as f:
        for line in LINES:
            f.write(json.dumps({"messages": [{"role": r, "content": c} for r, c in line]}, ensure_ascii=False) + "\n")


def install_megatron():
    root = os.environ.get("MEGATRON_LM")
    if not root:
        sys.exit("set MEGATRON_LM to a Megatron-LM main checkout (see the docstring)")

    def pkg(name):
        m = types.ModuleType(name)
        m.__path__ = [os.path.join(root, *name.split("."))]
        sys.modules[name] = m
        return m

    def mod(name, **attrs):
        m = types.ModuleType(name)
        m.__dict__.update(attrs)
        sys.modules[name] = m
        return m

    for name in ["megatron", "megatron.core", "megatron.core.datasets", "megatron.training",
                 "megatron.training.datasets", "megatron.core.tokenizers", "megatron.core.tokenizers.text",
                 "megatron.core.tokenizers.text.libraries"]:
        pkg(name)
    sys.modules["megatron.core.tokenizers"].MegatronTokenizerBase = object
    mod("megatron.core.utils", log_single_rank=lambda logger, level, *a, **k: None)
    mod("megatron.core.safe_globals", safe_numpy_load=None)
    mod("megatron.core.datasets.indexed_dataset", IndexedDataset=type("IndexedDataset", (), {}))
    mod("megatron.core.datasets.object_storage_utils", ObjectStorageConfig=object,
        is_object_storage_path=lambda p: False)
    mod("megatron.core.datasets.blended_dataset", BlendedDataset=type("BlendedDataset", (), {}))
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.tokenizers.text.libraries.sft_tokenizer import SFTTokenizer
    from megatron.training.datasets.sft_dataset import SFTDataset
    return BlendedMegatronDatasetBuilder, GPTDatasetConfig, SFTTokenizer, SFTDataset


class TextTokenizer:
    """MegatronTokenizerText's view of the SFT library tokenizer (pad, eod, vocab_size, tokenize_conversation)."""

    def __init__(self, sft, fmt):
        self._tokenizer = sft
        self.unique_identifiers = {"class": "SFTTokenizer", "prompt_format": fmt}

    @property
    def pad(self):
        return self._tokenizer.pad_id

    @property
    def eod(self):
        return self._tokenizer.eod

    @property
    def vocab_size(self):
        return self._tokenizer.vocab_size

    def tokenize_conversation(self, conversation, return_target, add_generation_prompt):
        return self._tokenizer.tokenize_conversation(conversation=conversation, return_target=return_target,
                                                     add_generation_prompt=add_generation_prompt)


def main():
    write_inputs()
    Builder, Config, SFTTokenizer, SFTDataset = install_megatron()
    golden = {"seq_length": SEQ, "configs": []}
    for name, fmt, cp, split, sizes in CONFIGS:
        tok = TextTokenizer(SFTTokenizer(OUT, fmt), fmt)
        config = Config(random_seed=1234, sequence_length=SEQ, blend=([os.path.join(OUT, "conversations.jsonl")], None),
                        split=split, tokenizer=tok, reset_position_ids=False, reset_attention_mask=False,
                        eod_mask_loss=False, create_attention_mask=False, context_parallel_size=cp)
        datasets = Builder(SFTDataset, list(sizes), lambda: True, config).build()
        entry = {"name": name, "prompt_format": fmt, "context_parallel_size": cp, "split": split,
                 "pad": int(tok.pad), "eod": int(tok.eod), "vocab_size": int(tok.vocab_size), "splits": {}}
        for split_name, ds in zip(["train", "valid", "test"], datasets):
            samples = []
            for i in range(len(ds)):
                line = int(ds.indices[i % len(ds.indices)])
                try:
                    s = ds[i]
                except (AssertionError, ValueError) as e:
                    samples.append({"index": i, "line": line, "error": type(e).__name__ + ": " + str(e).split(":")[0]})
                    continue
                cu = s["cu_seqlens"].tolist()
                cu = cu[: cu.index(SEQ) + 1]
                samples.append({"index": i, "line": line, "tokens": s["tokens"].tolist(), "labels": s["labels"].tolist(),
                                "loss_mask": [int(v) for v in s["loss_mask"].tolist()],
                                "position_ids": s["position_ids"].tolist(), "cu_seqlens": cu,
                                "max_seqlen": int(s["max_seqlen"])})
            entry["splits"][split_name] = {"lines": [int(ds.indices[0]), int(ds.indices[-1]) + 1], "samples": samples}
        golden["configs"].append(entry)
    with open(os.path.join(OUT, "golden.json"), "w") as f:
        json.dump(golden, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
