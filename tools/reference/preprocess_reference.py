#!/usr/bin/env python3
"""Golden .bin/.idx files written by Megatron's own tools/preprocess_data.py (core_v0.12.1).

Writes tests/data/reference/preprocess/{input.jsonl, megatron_*.bin/.idx}. The input has the
awkward cases: a list of texts, empty strings, an empty list, Unicode, and two keys. Megatron
finalizes only the last --json-keys entry (its bug #1010), so it is run once per key.

  MEGATRON_LM=/path/to/Megatron-LM@core_v0.12.1 /tmp/megvenv/bin/python tools/reference/preprocess_reference.py
(same environment as tokenizer_reference.py).
"""
import json
import os
import shutil
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "tests", "data", "reference", "preprocess")
sys.path.insert(0, HERE)
import megatron_stubs  # noqa: E402

RECORDS = [
    {"text": "It is a truth universally acknowledged.", "title": "Pride and Prejudice"},
    {"text": ["First sentence.", " Second one!", "", "Third\nline."], "title": "A list"},
    {"text": "", "title": "Empty text"},
    {"text": [], "title": ""},
    {"text": "caf\u00e9 \u4e2d\u6587 \U0001f980 <|endoftext|> <s> tabs\tand  spaces", "title": "Unicode"},
    {"text": "x" * 300, "title": "Long word"},
    {"title": "key order differs", "text": "Last document."},
]


def main():
    os.makedirs(OUT, exist_ok=True)
    jsonl = os.path.join(OUT, "input.jsonl")
    with open(jsonl, "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    gpt2 = os.path.join(REPO, "data", "tokenizers", "gpt2")
    llama3 = os.path.join(REPO, "tests", "data", "tokenizers", "llama3_style")
    tiktoken = os.path.join(REPO, "tests", "data", "tokenizers", "tiktoken_gpt2_3k.json")  # tiktoken_reference.py
    runs = [
        ("gpt2_eod", ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(gpt2, "vocab.json"),
                      "--merge-file", os.path.join(gpt2, "merges.txt"), "--append-eod"]),
        ("gpt2", ["--tokenizer-type", "GPT2BPETokenizer", "--vocab-file", os.path.join(gpt2, "vocab.json"),
                  "--merge-file", os.path.join(gpt2, "merges.txt")]),
        ("llama3_eod", ["--tokenizer-type", "HuggingFaceTokenizer", "--tokenizer-model", llama3, "--append-eod"]),
        ("tiktoken_v2_eod", ["--tokenizer-type", "TikTokenizer", "--tokenizer-model", tiktoken, "--tiktoken-pattern",
                             "v2", "--vocab-size", "4256", "--append-eod"]),
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in runs:
            for key in ["text", "title"]:
                prefix = os.path.join(tmp, name)
                megatron_stubs.run_preprocess_data(["--input", jsonl, "--output-prefix", prefix, "--json-keys", key,
                                                    "--workers", "1"] + flags)
                for ext in ["bin", "idx"]:
                    shutil.copy(f"{prefix}_{key}_document.{ext}", os.path.join(OUT, f"megatron_{name}_{key}_document.{ext}"))
    print("wrote", OUT, file=sys.stderr)


if __name__ == "__main__":
    main()
