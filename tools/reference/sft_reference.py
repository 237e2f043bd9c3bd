#!/usr/bin/env python3
"""Golden instruction datasets (MindSpeed-LLM's Alpaca and ShareGPT instruction handlers, --pack, --neat-pack) and SFT sample order.

An independent pure-Python statement of the rules Gale implements (read from MindSpeed-LLM's
data_handler.py, templates.py, configs/finetune/templates.json, utils.py and
decoder_packed_mtf_dataset.py; MindSpeed-LLM itself needs Ascend NPUs and is not imported), with
the Hugging Face `tokenizers` library (through transformers) for the text -> ids step. Writes
tests/data/reference/sft/: alpaca.jsonl and sharegpt.jsonl (the inputs), <config>_packed_<key>_document.bin/.idx
(Megatron's MMIDIDX format, int32) and order.json (the shuffled document order of
DecoderPackedMTFDataset and the legacy --split ranges).

  /tmp/megvenv/bin/python tools/reference/sft_reference.py     (transformers 4.51.3, tokenizers 0.21.4, numpy)
Deterministic: rerunning reproduces the committed bytes.
"""
import json
import os
import struct

import numpy as np
from transformers import PreTrainedTokenizerFast

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
OUT = os.path.join(REPO, "tests", "data", "reference", "sft")
TOKENIZERS = os.path.join(REPO, "tests", "data", "tokenizers")
IGNORE = -100

RECORDS = [
    {"instruction": "Name a colour.", "input": "", "output": "Blue."},
    {"instruction": "Add the numbers.", "input": "2 and 3", "output": "5"},
    {"instruction": "Greet me.", "input": "", "output": "Hello there!", "system": "You are terse."},
    {"instruction": "And now?", "input": "", "output": "Still here.",
     "history": [["Are you there?", "Yes."]]},
    {"instruction": "Write a long story.", "input": "",
     "output": "Once upon a time there was a very long story that went on and on " * 6},
    {"instruction": "Two answers", "input": "", "output": ["first", "second"]},
    {"instruction": "", "input": "only an input", "output": "ok"},
    {"instruction": "No answer", "input": "", "output": None},
    {"instruction": "Empty answer list", "input": "", "output": []},
]

# ShareGPT records (SharegptStyleInstructionHandler): a system message, a mapped system column,
# multi-turn, then the records MindSpeed-LLM skips (wrong order, odd count, no messages) and one
# whose missing content leaves an even, alternating list.
SHAREGPT_RECORDS = [
    {"conversations": [{"from": "human", "value": "Hi!"}, {"from": "gpt", "value": "Hello."}]},
    {"conversations": [{"from": "system", "value": "Be brief."}, {"from": "human", "value": "Capital of France?"},
                       {"from": "gpt", "value": "Paris."}], "system": "ignored: the message wins"},
    {"conversations": [{"from": "human", "value": "One"}, {"from": "gpt", "value": "Two"},
                       {"from": "human", "value": "Three"}, {"from": "gpt", "value": "Four"}],
     "system": "Count along."},
    {"conversations": [{"from": "gpt", "value": "I speak first"}, {"from": "human", "value": "no"}]},
    {"conversations": [{"from": "human", "value": "Alone"}]},
    {"conversations": []},
    {"conversations": [{"from": "human"}, {"from": "gpt"}, {"from": "human", "value": "Again?"},
                       {"from": "gpt", "value": "Yes."}]},
    {"conversations": [{"from": "human", "value": "Tell a long tale."},
                       {"from": "gpt", "value": "A tale that goes on and on and on. " * 12}]},
]
# name, tokenizer folder, template, map_keys (None: the defaults), seq_length
SHAREGPT_CONFIGS = [
    ("sharegpt_qwen", "qwen2_style", "qwen", {"system": "system"}, 120),
    ("sharegpt_llama3", "llama3_style", "llama3", None, 200),
]

# name, tokenizer folder, template, map_keys (None: the defaults), seq_length, append_eod
# (PACK_CONFIGS: the same with --pack)
FULL_KEYS = {"prompt": "instruction", "query": "input", "response": "output", "system": "system",
             "history": "history"}
CONFIGS = [
    ("qwen", "qwen2_style", "qwen", FULL_KEYS, 120, False),
    ("empty_eod", "qwen2_style", "empty", None, 120, True),
    ("alpaca_eod", "qwen2_style", "alpaca", FULL_KEYS, 160, True),
    ("llama3", "llama3_style", "llama3", FULL_KEYS, 200, False),
]
PACK_CONFIGS = [
    ("qwen_pack", "qwen2_style", "qwen", FULL_KEYS, 120, False),
    ("llama3_pack", "llama3_style", "llama3", FULL_KEYS, 200, False),
]
# --pack --neat-pack: short enough that the long story is cut (per turn, then to seq_length - 1)
NEAT_CONFIGS = [
    ("qwen_neat", "qwen2_style", "qwen", FULL_KEYS, 100, False),
    ("llama3_neat", "llama3_style", "llama3", FULL_KEYS, 140, True),
]

BOS, EOS = "<bos>", "<eos>"  # slot markers
# The four templates as configs/finetune/templates.json defines them (unset formatters take the
# Template defaults: system "{{content}}", assistant "{{content}}" + EOS).
TEMPLATES = {
    "empty": dict(prefix=[], system=["{{content}}"], user=["{{content}}"], assistant=["{{content}}"], sep=[],
                  default_system="", replace_eos=None),
    "qwen": dict(prefix=[], system=["<|im_start|>system\n{{content}}<|im_end|>\n"],
                 user=["<|im_start|>user\n{{content}}<|im_end|>\n<|im_start|>assistant\n"],
                 assistant=["{{content}}", EOS], sep=["\n"], default_system="You are a helpful assistant.",
                 replace_eos="<|im_end|>"),
    "llama3": dict(prefix=[BOS], system=["<|start_header_id|>system<|end_header_id|>\n\n{{content}}<|eot_id|>"],
                   user=["<|start_header_id|>user<|end_header_id|>\n\n{{content}}<|eot_id|>"
                         "<|start_header_id|>assistant<|end_header_id|>\n\n"],
                   assistant=["{{content}}", EOS], sep=[], default_system="", replace_eos="<|eot_id|>"),
    "alpaca": dict(prefix=[], system=["{{content}}"], user=["### Instruction:\n{{content}}\n\n### Response:\n"],
                   assistant=["{{content}}", EOS], sep=["\n\n"],
                   default_system="Below is an instruction that describes a task. "
                                  "Write a response that appropriately completes the request.\n\n",
                   replace_eos=None),
}


def load_tokenizer(folder):
    cfg = json.load(open(os.path.join(TOKENIZERS, folder, "tokenizer_config.json")))
    tok = PreTrainedTokenizerFast(tokenizer_file=os.path.join(TOKENIZERS, folder, "tokenizer.json"),
                                  **{k: v for k, v in cfg.items() if k.endswith("_token")})
    return tok


def conversation(rec, keys):
    keys = keys or {"prompt": "instruction", "query": "input", "response": "output"}
    msgs = []
    if keys.get("history") and isinstance(rec.get(keys["history"]), list):
        for q, a in rec[keys["history"]]:
            msgs += [("user", q), ("assistant", a)]
    parts = [rec[k] for k in (keys.get("prompt"), keys.get("query")) if k and rec.get(k)]
    msgs.append(("user", "\n".join(parts)))
    resp = rec.get(keys["response"])
    resp = [resp] if isinstance(resp, str) else (resp if isinstance(resp, list) else [])
    if not resp:
        return None, None  # align_dataset's filter: no response, no record
    if len(resp) != 1:
        msgs = [("user", ""), ("assistant", "")]
    else:
        msgs.append(("assistant", resp[0]))
    system = rec.get(keys["system"]) if keys.get("system") else None
    return msgs, system


def sharegpt_conversation(rec, keys):
    """convert_sharegpt_to_intermediate with the default tags (from/value, human/gpt/system)."""
    keys = keys or {}
    msgs = rec["conversations"]
    if msgs and msgs[0].get("from") == "system":
        system, msgs = msgs[0]["value"], msgs[1:]
    else:
        system = rec.get(keys["system"]) if keys.get("system") else None
    if not msgs:
        return None, None
    broken, aligned = False, []
    for i, m in enumerate(msgs):
        if m.get("from") != ("human" if i % 2 == 0 else "gpt"):
            broken = True
        if m.get("value") is not None:
            aligned.append(("user" if m["from"] == "human" else "assistant", m["value"]))
    if broken or len(aligned) % 2 != 0:
        return None, None  # skipped, as the empty outputs are filtered
    return aligned, system


def slot_ids(slots, content, tok, bos, eos):
    ids = []
    for s in slots:
        if s == BOS:
            ids += [bos] if bos is not None else []
        elif s == EOS:
            ids += [eos]
        else:
            text = s.replace("{{content}}", content, 1)
            if text:
                ids += tok.encode(text, add_special_tokens=False)
    return ids


def infer_seqlen(source_len, target_len, cutoff):
    """LLaMA-Factory's _infer_seqlen (MindSpeed-LLM's copy in decoder_packed_mtf_dataset.py)."""
    if target_len * 2 < cutoff:
        max_target = cutoff
    elif source_len * 2 < cutoff:
        max_target = cutoff - source_len
    else:
        max_target = int(cutoff * (target_len / (source_len + target_len)))
    target = min(max_target, target_len)
    source = min(max(cutoff - target, 0), source_len)
    return source, target


def encode(rec, keys, tmpl, tok, seq_length, append_eod, neat=False, convert=None):
    eos = tok.convert_tokens_to_ids(tmpl["replace_eos"]) if tmpl["replace_eos"] else tok.eos_token_id
    bos = tok.bos_token_id
    msgs, system = (convert or conversation)(rec, keys)
    if msgs is None:
        return None, None
    system = system or tmpl["default_system"]
    encoded = []
    for i, (role, content) in enumerate(msgs):
        ids = []
        if i == 0:
            ids += slot_ids(tmpl["prefix"], "", tok, bos, eos)
            if system:
                ids += slot_ids(tmpl["system"], system, tok, bos, eos)
        elif i % 2 == 0:
            ids += slot_ids(tmpl["sep"], "", tok, bos, eos)
        ids += slot_ids(tmpl["user"] if role == "user" else tmpl["assistant"], content, tok, bos, eos)
        encoded.append(ids)
    input_ids, labels, total = [], [], 0
    for i in range(0, len(encoded), 2):  # cut to the cutoff as Template._make_pairs / infer_max_len
        if total >= seq_length:
            break
        src, tgt, max_len = encoded[i], encoded[i + 1], seq_length - total
        max_tgt = 0 if not (src or tgt) else int(max_len * (len(tgt) / (len(src) + len(tgt))))
        max_tgt = max(max_tgt, 1)
        max_src = max_len - min(max_tgt, len(tgt))
        src, tgt = src[:max_src], tgt[:max_tgt]
        total += len(src) + len(tgt)
        if neat:  # _tokenize_prompt cuts each turn again for --neat-pack
            keep_src, keep_tgt = infer_seqlen(len(src), len(tgt), seq_length - 1)
            src, tgt = src[:keep_src], tgt[:keep_tgt]
        input_ids += src + tgt
        labels += [IGNORE] * len(src) + tgt
    if append_eod:
        input_ids.append(eos)
        labels.append(eos)
    return input_ids, labels


def pack(samples, seq_length, pad, neat=False):
    """_pack_serialize_to_disk: greedy knapsack into seq_length - 1, padded packs; with neat packing
    the attention mask numbers the pack's samples 1, 2, ... and is 0 on the padding."""
    by_length = {}
    for n, (ids, labels) in enumerate(samples):
        by_length.setdefault(len(ids), []).append(n)
    numbers = sorted(len(ids) for ids, _ in samples)
    packs = []
    while numbers:  # greedy_knapsack: repeatedly the largest length that still fits
        taken, remaining = [], seq_length - 1
        while True:
            fits = [k for k, x in enumerate(numbers) if x <= remaining]
            if not fits:
                break
            x = numbers.pop(fits[-1])
            remaining -= x
            taken.append(x)
        ids, masks, labels = [], [], []
        for k, x in enumerate(taken):
            n = by_length[x].pop()
            ids += samples[n][0]
            masks += [k + 1 if neat else 1] * len(samples[n][0])
            labels += samples[n][1]
        pad_len = seq_length - len(ids)
        packs.append((ids + [pad] * pad_len, masks + [0 if neat else 1] * pad_len, labels + [IGNORE] * pad_len))
    return packs


def write_mmidx(prefix, docs):
    """docs: list of int lists, or None for a dropped record (an empty document)."""
    lengths, pointers, doc_idx, offset = [], [], [0], 0
    with open(prefix + ".bin", "wb") as f:
        for d in docs:
            if d is not None:
                f.write(np.asarray(d, dtype=np.int32).tobytes())
                lengths.append(len(d))
                pointers.append(offset)
                offset += 4 * len(d)
            doc_idx.append(len(lengths))
    with open(prefix + ".idx", "wb") as f:
        f.write(b"MMIDIDX\x00\x00" + struct.pack("<Q", 1) + struct.pack("<B", 4))
        f.write(struct.pack("<Q", len(lengths)) + struct.pack("<Q", len(doc_idx)))
        f.write(np.asarray(lengths, dtype=np.int32).tobytes())
        f.write(np.asarray(pointers, dtype=np.int64).tobytes())
        f.write(np.asarray(doc_idx, dtype=np.int64).tobytes())


def legacy_split(split, size):
    """megatron.legacy.data.dataset_utils.get_train_valid_test_split_ (MindSpeed-LLM's instruction split)."""
    sep = "," if "," in split else ("/" if "/" in split else None)
    w = [float(s) for s in split.split(sep)] if sep else [float(split)]
    w = (w + [0.0, 0.0])[:3]
    w = [x / sum(w) for x in w]
    idx = [0]
    for x in w:
        idx.append(idx[-1] + int(round(x * float(size))))
    diff = idx[-1] - size
    return [idx[0]] + [i - diff for i in idx[1:]]


def shuffle_order(start, count, num_samples, seed):
    """DecoderPackedMTFDataset._build_index_mappings: whole shuffled epochs until num_samples are covered."""
    rng = np.random.RandomState(seed=seed)
    order = []
    while len(order) < num_samples:
        epoch = np.arange(start, start + count, dtype=np.int64)
        rng.shuffle(epoch)
        order += epoch.tolist()
    return order


def write_jsonl(file_name, records):
    with open(os.path.join(OUT, file_name), "w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")


def write_samples(name, records, folder, tmpl, keys, seq_length, eod, convert):
    """One document per record; a record of seq_length ids or more leaves an empty document."""
    tok = load_tokenizer(folder)
    ids, masks, labels, kept = [], [], [], []
    for r in records:
        i, l = encode(r, keys, TEMPLATES[tmpl], tok, seq_length, eod, convert=convert)
        if i is None:
            continue  # filtered: not even an empty document
        keep = len(i) < seq_length
        ids.append(i if keep else None)
        masks.append([1] * len(i) if keep else None)
        labels.append(l if keep else None)
        kept.append(len(i) if keep else -len(i))
    for key, docs in (("input_ids", ids), ("attention_mask", masks), ("labels", labels)):
        write_mmidx(os.path.join(OUT, f"{name}_packed_{key}_document"), docs)
    print(name, "lengths (negative: dropped):", kept)


def write_packs(name, folder, tmpl, keys, seq_length, eod, neat):
    """--pack (and --neat-pack: long samples cut to seq_length - 1 instead of dropped)."""
    tok = load_tokenizer(folder)
    samples = []
    for r in RECORDS:
        i, l = encode(r, keys, TEMPLATES[tmpl], tok, seq_length, eod, neat=neat)
        if i is not None and (neat or len(i) < seq_length):
            samples.append((i[:seq_length - 1], l[:seq_length - 1]))
    t = TEMPLATES[tmpl]
    eos = tok.convert_tokens_to_ids(t["replace_eos"]) if t["replace_eos"] else tok.eos_token_id
    pad = tok.pad_token_id if tok.pad_token_id is not None else eos
    packs = pack(samples, seq_length, pad, neat=neat)
    for k, key in enumerate(("input_ids", "attention_mask", "labels")):
        write_mmidx(os.path.join(OUT, f"{name}_packed_{key}_document"), [p[k] for p in packs])
    print(name, "neat packs of" if neat else "packs of", [len(s[0]) for s in samples], "->", len(packs))


def main():
    os.makedirs(OUT, exist_ok=True)
    write_jsonl("alpaca.jsonl", RECORDS)
    for name, folder, tmpl, keys, seq_length, eod in CONFIGS:
        write_samples(name, RECORDS, folder, tmpl, keys, seq_length, eod, conversation)
    for name, folder, tmpl, keys, seq_length, eod in PACK_CONFIGS:
        write_packs(name, folder, tmpl, keys, seq_length, eod, neat=False)
    for name, folder, tmpl, keys, seq_length, eod in NEAT_CONFIGS:
        write_packs(name, folder, tmpl, keys, seq_length, eod, neat=True)
    write_jsonl("sharegpt.jsonl", SHAREGPT_RECORDS)
    for name, folder, tmpl, keys, seq_length in SHAREGPT_CONFIGS:
        write_samples(name, SHAREGPT_RECORDS, folder, tmpl, keys, seq_length, False, sharegpt_conversation)
    order = {}
    for split, size, seed, gbs_samples in (("90,5,5", 37, 1234, 100), ("98,2,0", 5, 7, 12), ("1", 3, 42, 4)):
        bounds = legacy_split(split, size)
        order[f"{split}|{size}|{seed}|{gbs_samples}"] = {
            "bounds": bounds,
            "train": shuffle_order(bounds[0], bounds[1] - bounds[0], gbs_samples, seed)}
    with open(os.path.join(OUT, "order.json"), "w") as f:
        json.dump(order, f)
        f.write("\n")


if __name__ == "__main__":
    main()
