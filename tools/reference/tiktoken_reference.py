#!/usr/bin/env python3
"""Reference ids and pieces for Gale's TikTokenizer, from Megatron's CustomTikTokenizer and tiktoken.

Writes (small, committed; CI needs none of these packages):
  tests/data/tokenizers/tiktoken_gpt2_3k.json     a TikTokenizer vocabulary in Megatron's format (a JSON list
                                                  of {rank, token_bytes, token_str}): the 256 bytes, then the
                                                  first 3000 merges of the repository's GPT-2 merges.txt
  tests/data/reference/tiktoken_golden.json       ids and decoded text for three configurations, and the
                                                  pieces of Megatron's v1 and v2 split patterns (Python `regex`,
                                                  cross-checked with tiktoken's own splitting) for the shared
                                                  tokenizer texts plus random strings over every character class

Setup (a private environment, never a CI requirement):
  python3 -m venv /tmp/tkv && /tmp/tkv/bin/pip install tiktoken regex numpy
  git clone https://github.com/NVIDIA/Megatron-LM && git -C Megatron-LM checkout core_v0.12.1
  MEGATRON_LM=$PWD/Megatron-LM /tmp/tkv/bin/python tools/reference/tiktoken_reference.py
"""
import base64
import json
import os
import random
import sys

import regex

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
VOCAB_OUT = os.path.join(REPO, "tests", "data", "tokenizers", "tiktoken_gpt2_3k.json")
OUT = os.path.join(REPO, "tests", "data", "reference", "tiktoken_golden.json")
MERGES = 3000

EXTRA_TEXTS = [
    "HelloWORLDFoo XMLHttpRequest iPhone McDonald's ABCdef abcDEF aBcDeF",
    "\u01c5ungla \u01c8\u01c9\u01c7 \u02b0ello \u1d2c\u1d2e\u1d30 \u00aa\u00ba",  # Lt, Lm, Lo
    "e\u0301 E\u0301X \u0301\u0302 a\u20dd \u0928\u092e\u0938\u094d\u0924\u0947 \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35",
    "\u0645\u064e\u0631\u0652\u062d\u064e\u0628\u064b\u0627 123abc 4\u00bd \u216b x\u00b2",
    "a/b/c\n/d ,\n/x x  \n\n  y \r\n\r\n z\t\n",
    "'s 'S 're 'll it's IT'S don't",
    "\U0001d400\U0001d41a \U0001d7ce",  # mathematical bold A, a, digit zero
]

# Character palette for random strings: every class the v1/v2 patterns distinguish.
PALETTE = (list("ABZaz09 \n\r\t/'.,-_\u00a0") + ["\u01c5", "\u02b0", "\u00aa", "\u4e2d", "\u0301", "\u0928",
           "\u094d", "\u00c9", "\u00e9", "\u03a9", "\u03c9", "\u216b", "\u00bd", "\U0001f980", "\u3000", "\u2028",
           "\u0645", "\u064e", "\u1d2c", "\u20dd", "\u0e31"])


def gpt2_ranks():
    byte_chars = bytes_to_unicode()
    char_bytes = {c: b for b, c in byte_chars.items()}
    ranks = {bytes([b]): b for b in range(256)}
    with open(os.path.join(REPO, "data", "tokenizers", "gpt2", "merges.txt"), encoding="utf-8") as f:
        lines = [l.rstrip("\n") for l in f if l.strip() and not l.startswith("#version")]
    for line in lines[:MERGES]:
        a, b = line.split(" ")
        tok = bytes(char_bytes[c] for c in a + b)
        assert tok not in ranks
        ranks[tok] = len(ranks)
    return ranks


def bytes_to_unicode():
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\u00a1"), ord("\u00ac") + 1)) + \
        list(range(ord("\u00ae"), ord("\u00ff") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs)))


def main():
    sys.path.insert(0, HERE)
    import megatron_stubs
    import tiktoken
    from tokenizer_reference import TEXTS
    T = megatron_stubs.install()

    ranks = gpt2_ranks()
    vocab = [{"rank": r, "token_bytes": base64.b64encode(t).decode("ascii"),
              "token_str": t.decode("utf-8", errors="replace")} for t, r in sorted(ranks.items(), key=lambda x: x[1])]
    with open(VOCAB_OUT, "w", encoding="utf-8") as f:
        json.dump(vocab, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")

    rng = random.Random(1234)
    fuzz = ["".join(rng.choice(PALETTE) for _ in range(rng.randint(1, 24))) for _ in range(300)]
    texts = TEXTS + EXTRA_TEXTS
    patterns = {"v1": T.PATTERN_TIKTOKEN, "v2": T.PATTERN_TIKTOKEN_V2}
    out = {"generator": "tools/reference/tiktoken_reference.py", "vocab": os.path.relpath(VOCAB_OUT, REPO),
           "texts": texts, "fuzz": fuzz, "pieces": {}, "configs": []}
    for name, pat in patterns.items():
        pieces = [regex.findall(pat, t) for t in texts + fuzz]
        # tiktoken's own regex engine (fancy-regex) must agree: encode each text with the bytes plus one
        # token per piece, then compare the decoded tokens with the pieces.
        for t, p in zip(texts + fuzz, pieces):
            assert "".join(p) == t
            ranks_probe = {bytes([b]): b for b in range(256)}
            for piece in p:
                ranks_probe.setdefault(piece.encode("utf-8"), len(ranks_probe))
            probe = tiktoken.Encoding(name="p", pat_str=pat, mergeable_ranks=ranks_probe, special_tokens={})
            got = [probe.decode_single_token_bytes(i).decode("utf-8") for i in probe.encode_ordinary(t)]
            if got != p:
                sys.exit(f"regex and tiktoken split {t!r} differently under {name}:\n{p}\n{got}")
        out["pieces"][name] = pieces

    class Args:
        rank = 1
        make_vocab_size_divisible_by = 128
        tensor_model_parallel_size = 1
        vocab_extra_ids = 0
        vocab_file = merge_file = None
        trust_remote_code = False

    configs = [
        ("v1", 1000 + len(ranks), 1000, None),
        ("v2", 1000 + len(ranks), 1000, None),
        ("v2", 8 + 2500, 8, ["<pad>", "</s>", "<unk>", "<s>", "<|im_start|>"]),  # cut vocabulary, custom order
    ]
    for pattern, vocab_size, nspecial, specials in configs:
        a = Args()
        a.tokenizer_type = "TikTokenizer"
        a.tokenizer_model = VOCAB_OUT
        a.tiktoken_pattern = pattern
        a.vocab_size = vocab_size
        a.tiktoken_num_special_tokens = nspecial
        a.tiktoken_special_tokens = specials
        tok = T.build_tokenizer(a)
        ids = [tok.tokenize(t) for t in texts]
        # The same ids from tiktoken directly (Megatron's class wraps it; this checks the wrapping).
        inner = {t: r + nspecial for t, r in ranks.items() if r < vocab_size - nspecial}
        names = (specials or ["<unk>", "<s>", "</s>"])
        names = names + ["<SPECIAL_%d>" % i for i in range(len(names), nspecial)]
        enc = tiktoken.Encoding(name="x", pat_str=patterns[pattern], mergeable_ranks=inner,
                                special_tokens={s: i for i, s in enumerate(names)})
        for t, i in zip(texts, ids):
            assert enc.encode_ordinary(t) == i, t
        decode_ids = [[tok.bos] + ids[9] + [tok.eos], [5, 6, 7], [nspecial + 0xE4, nspecial + 0xB8]]  # specials, bytes
        out["configs"].append({
            "pattern": pattern, "vocab_size": vocab_size, "num_special_tokens": nspecial, "special_tokens": specials,
            "reported_vocab_size": tok.vocab_size, "eod": tok.eod, "bos": tok.bos, "unk": tok.unk,
            "padded_vocab_size": T._vocab_size_with_padding(tok.vocab_size, a),
            "ids": ids, "decoded": [tok.detokenize(i) for i in ids],
            "decode_ids": decode_ids, "decode_text": [tok.detokenize(i) for i in decode_ids]})
        print(f"{pattern}: vocab {tok.vocab_size}, eod {tok.eod}", file=sys.stderr)

    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes), {VOCAB_OUT} ({os.path.getsize(VOCAB_OUT)} bytes)",
          file=sys.stderr)


if __name__ == "__main__":
    main()
