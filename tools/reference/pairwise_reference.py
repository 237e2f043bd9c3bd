#!/usr/bin/env python3
"""Golden pairwise datasets of MindSpeed-LLM's AlpacaStylePairwiseHandler (DPO preprocessing).

An independent pure-Python statement of the handler's rules (read from MindSpeed-LLM's
data_handler.py AlpacaStylePairwiseHandler._filter, utils.py convert_alpaca_to_intermediate with
ranking, templates.py encode_oneturn and BaseDatasetHandler._serialize_to_disk; MindSpeed-LLM itself
is not imported), on top of sft_reference.py's template slots and the Hugging Face tokenizers for
the text -> ids step. Writes tests/data/reference/dpo/: pairwise.jsonl (the input) and
<config>_packed_{chosen_input_ids,chosen_labels,rejected_input_ids,rejected_labels}_document.bin/.idx.

Rules: prompt messages = history pairs, then the user message "instruction\\ninput" (non-empty
parts); chosen = the chosen column (a string, or element 0 of a list), rejected = the rejected
column (a string, or element 1 of a list); a record missing either is skipped. Each message is
encoded as its template slots (the system text and the prefix in the first); prompt ids = all but
the last message's ids, response ids = the last one's (no truncation). input_ids = prompt +
response, labels = -100 x len(prompt) + response, for chosen and rejected (both with the chosen
encoding's prompt). A pair with a sequence of seq_length ids or more leaves an empty document in
all four datasets.

  /tmp/tv/bin/python tools/reference/pairwise_reference.py    (transformers 4.51.3, tokenizers 0.21.4, numpy)
Deterministic: rerunning reproduces the committed bytes.
"""
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import sft_reference as sft  # noqa: E402  (templates, slot encoding, tokenizer loading, .idx writer)

OUT = os.path.join(sft.REPO, "tests", "data", "reference", "dpo")
IGNORE = -100

RECORDS = [
    {"instruction": "Name a colour.", "input": "", "chosen": "Blue.", "rejected": "Seven."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "chosen": "5", "rejected": "23", "system": "You are terse."},
    {"instruction": "And now?", "input": "", "chosen": "Still here.", "rejected": "Gone.",
     "history": [["Are you there?", "Yes."]]},
    {"instruction": "Pick a letter.", "input": "", "chosen": ["A", "B"], "rejected": ["C", "D"]},
    {"instruction": "Tell a story.", "input": "", "chosen": "Short.",
     "rejected": "A story that goes on and on and on without an end. " * 8},
    {"instruction": "No rejected answer", "input": "", "chosen": "yes", "rejected": None},
    {"instruction": "", "input": "only an input", "chosen": "ok", "rejected": "no"},
]
FULL_KEYS = {"prompt": "instruction", "query": "input", "system": "system", "history": "history",
             "chosen": "chosen", "rejected": "rejected"}
# name, tokenizer folder, template, map_keys (None: the defaults), seq_length
CONFIGS = [
    ("qwen", "qwen2_style", "qwen", FULL_KEYS, 64),
    ("llama3", "llama3_style", "llama3", None, 96),
    ("alpaca", "qwen2_style", "alpaca", FULL_KEYS, 120),
]


def messages(rec, keys):
    keys = keys or {}
    k = lambda name, default: keys.get(name, default)  # noqa: E731
    msgs = []
    if k("history", None) and isinstance(rec.get(k("history", None)), list):
        for q, a in rec[k("history", None)]:
            msgs += [("user", q), ("assistant", a)]
    parts = [rec[c] for c in (k("prompt", "instruction"), k("query", "input")) if c and rec.get(c)]
    msgs.append(("user", "\n".join(parts)))
    chosen, rejected = rec.get(k("chosen", "chosen")), rec.get(k("rejected", "rejected"))
    if chosen is None or rejected is None:
        return None, None, None
    chosen = chosen[0] if isinstance(chosen, list) else chosen
    rejected = rejected[1] if isinstance(rejected, list) else rejected
    system = rec.get(keys["system"]) if keys.get("system") else None
    return msgs, (chosen, rejected), system


def encode_messages(msgs, system, tmpl, tok):
    eos = tok.convert_tokens_to_ids(tmpl["replace_eos"]) if tmpl["replace_eos"] else tok.eos_token_id
    bos = tok.bos_token_id
    system = system or tmpl["default_system"]
    encoded = []
    for i, (role, content) in enumerate(msgs):
        ids = []
        if i == 0:
            ids += sft.slot_ids(tmpl["prefix"], "", tok, bos, eos)
            if system:
                ids += sft.slot_ids(tmpl["system"], system, tok, bos, eos)
        elif i % 2 == 0:
            ids += sft.slot_ids(tmpl["sep"], "", tok, bos, eos)
        ids += sft.slot_ids(tmpl["user"] if role == "user" else tmpl["assistant"], content, tok, bos, eos)
        encoded.append(ids)
    return sum(encoded[:-1], []), encoded[-1]


def write_config(name, folder, tmpl_name, keys, seq_length):
    tok = sft.load_tokenizer(folder)
    tmpl = sft.TEMPLATES[tmpl_name]
    docs = {k: [] for k in ("chosen_input_ids", "chosen_labels", "rejected_input_ids", "rejected_labels")}
    for rec in RECORDS:
        msgs, responses, system = messages(rec, keys)
        if msgs is None:
            continue
        prompt, chosen = encode_messages(msgs + [("assistant", responses[0])], system, tmpl, tok)
        _, rejected = encode_messages(msgs + [("assistant", responses[1])], system, tmpl, tok)
        if len(prompt) + len(chosen) >= seq_length or len(prompt) + len(rejected) >= seq_length:
            for v in docs.values():
                v.append(None)
            continue
        docs["chosen_input_ids"].append(prompt + chosen)
        docs["chosen_labels"].append([IGNORE] * len(prompt) + chosen)
        docs["rejected_input_ids"].append(prompt + rejected)
        docs["rejected_labels"].append([IGNORE] * len(prompt) + rejected)
    for key, d in docs.items():
        sft.write_mmidx(os.path.join(OUT, f"{name}_packed_{key}_document"), d)


def main():
    os.makedirs(OUT, exist_ok=True)
    with open(os.path.join(OUT, "pairwise.jsonl"), "w", encoding="utf-8") as f:
        for r in RECORDS:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    for config in CONFIGS:
        write_config(*config)


if __name__ == "__main__":
    main()
