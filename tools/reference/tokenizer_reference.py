#!/usr/bin/env python3
"""Reference token ids for Gale's tokenizer tests, from the real libraries and Megatron's own classes.

Writes (all small, committed; CI needs none of these packages):
  tests/data/tokenizers/<name>/tokenizer.json (+ tokenizer_config.json)  small tokenizers trained here
  tests/data/tokenizers/spm_austen.model                                a SentencePiece model (Debian's spm_train)
  tests/data/reference/tokenizer_golden.json                            texts, ids and decoded strings

Setup (a private environment, never a CI requirement):
  /usr/bin/python3 -m venv --system-site-packages /tmp/megvenv     # Debian's numpy 1.24 + torch 1.13
  /tmp/megvenv/bin/pip install tokenizers tiktoken sentencepiece regex transformers
  git clone https://github.com/NVIDIA/Megatron-LM && git -C Megatron-LM checkout core_v0.12.1
  MEGATRON_LM=$PWD/Megatron-LM /tmp/megvenv/bin/python tools/reference/tokenizer_reference.py

The ids of every Megatron tokenizer type come from Megatron's classes themselves
(megatron/training/tokenizer/tokenizer.py, imported with its heavy package __init__ files
stubbed out) and are cross-checked against tiktoken (GPT-2), Hugging Face `tokenizers` and
`sentencepiece` directly; the script stops if they disagree.
"""
import json
import os
import subprocess
import sys
import tempfile
import types

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
SHARED = os.path.normpath(os.path.join(REPO, "..", "shared", "data"))
TOK_DIR = os.path.join(REPO, "tests", "data", "tokenizers")
OUT = os.path.join(REPO, "tests", "data", "reference", "tokenizer_golden.json")

TEXTS = [
    "",
    "Hello, world!",
    "The quick brown fox jumps over the lazy dog.",
    "a  b   c    d     e",
    "   leading and trailing spaces   ",
    "tabs\tand\t\ttabs\t",
    "new\nlines\n\n\nand\r\nCRLF\r\n",
    " \n \t \n  mixed \n\n  whitespace ",
    "\u00a0no-break\u00a0space and\u3000ideographic\u2003em space",
    "I'm sure you're right, they've said it's Bob's and I'll do what he'd do.",
    "I'M SURE YOU'RE RIGHT, THEY'VE SAID IT'S BOB'S AND I'LL DO WHAT HE'D DO.",
    "don't DON'T Don'T won\u2019t 'quoted' ''",
    "1234567890123456789012345678901234567890",
    "Pi is 3.14159265358979, e is 2.718281828; year 2024; 1,000,000 and x=12345 y=-678.",
    "\u4e2d\u6587\u5206\u8bcd\u6d4b\u8bd5\uff1a\u4eca\u5929\u5929\u6c14\u5f88\u597d\u3002",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3002 \ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00c5ngstr\u00f6m fa\u00e7ade Z\u00fcrich Stra\u00dfe \u0152uvre",
    "cafe\u0301 nai\u0308ve (decomposed accents)",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac \u03ba\u03b1\u03b9 \u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442 \u0627\u0644\u0639\u0631\u0628\u064a\u0629",
    "I love \U0001f980 and \U0001f40d!",
    "family: \U0001f468\u200d\U0001f469\u200d\U0001f467\u200d\U0001f466 coder: \U0001f469\U0001f3fd\u200d\U0001f4bb flags: \U0001f1eb\U0001f1f7\U0001f1ef\U0001f1f5 \u2764\ufe0f \u2728",
    "Hello <|endoftext|> world<|endoftext|>",
    "<s>start and end</s> <unk> <EOD> <pad>",
    "<|im_start|>user\nhi there<|im_end|>\n<|begin_of_text|>x<|end_of_text|>",
    "a  <mask> b<mask>c <tool> x<tool>y <tool>\t@@user@@ hi @@USER@@",
    "def f(x):\n    return x ** 2  # square\n\n\tprint({\"a\": [1, 2, 3]})\n",
    "Wait... what?!? (yes) [no] {maybe} <tag> @user #hash $100 50% a&b ~tilde~ `code`",
    "\u017f test '\u017f and 'S",
    "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "\x1c\x1d\x1e\x1f separators \x0b\x0c\x85 controls\u2028line\u2029para",
    "   ",
    "\n",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.\n\nHowever little known the feelings or views of such a man may be on his "
    "first entering a neighbourhood, this truth is so well fixed in the minds of the surrounding families, "
    "that he is considered the rightful property of some one or other of their daughters.",
]


def megatron_module():
    sys.path.insert(0, HERE)
    import megatron_stubs
    return megatron_stubs.install()


def megatron_tokenizer(T, **kw):
    class Args:
        rank = 1
        make_vocab_size_divisible_by = 128
        tensor_model_parallel_size = 1
        vocab_extra_ids = 0
        vocab_file = merge_file = tokenizer_model = vocab_size = None
        trust_remote_code = False
    a = Args()
    for k, v in kw.items():
        setattr(a, k, v)
    return T.build_tokenizer(a)


def corpus_lines(limit_chars=1_500_000):
    text = []
    n = 0
    with open(os.path.join(SHARED, "corpus", "austen.jsonl"), encoding="utf-8") as f:
        for line in f:
            t = json.loads(line)["text"]
            text.append(t)
            n += len(t)
            if n > limit_chars:
                break
    # A little non-English text so that the small vocabularies have some multi-byte merges.
    text += [TEXTS[14], TEXTS[15], TEXTS[18], TEXTS[16]] * 20
    return text


def write_tokenizer(tok, name, config):
    d = os.path.join(TOK_DIR, name)
    os.makedirs(d, exist_ok=True)
    tok.save(os.path.join(d, "tokenizer.json"))
    with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
        json.dump(config, f, indent=1)
    return d


def train_fixtures():
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers

    lines = corpus_lines()
    llama3_re = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                 r"\s*[\r\n]+|\s+(?!\S)|\s+")
    qwen2_re = llama3_re.replace(r"\p{N}{1,3}", r"\p{N}")
    made = {}

    # Llama-3 style: Split regex + ByteLevel, ignore_merges, BOS template, special tokens.
    t = Tokenizer(models.BPE(ignore_merges=True))
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(llama3_re), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"]
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1200, special_tokens=specials,
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    bos = t.token_to_id("<|begin_of_text|>")
    t.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(single="<|begin_of_text|> $A", special_tokens=[("<|begin_of_text|>", bos)])])
    made["llama3_style"] = write_tokenizer(t, "llama3_style", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"})

    # Qwen2 style: NFC, single-digit split, no BOS; pad = eod as in Qwen2's config.
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.NFC()
    t.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(qwen2_re), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    t.decoder = decoders.ByteLevel()
    t.post_processor = processors.ByteLevel(trim_offsets=False)
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1100, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                     show_progress=False))
    t.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]])
    # A single-word special token and a normalized (non-special) added token.
    t.add_special_tokens([AddedToken("<tool>", single_word=True, normalized=False, special=True)])
    t.add_tokens([AddedToken("@@user@@", normalized=True, special=False)])
    made["qwen2_style"] = write_tokenizer(t, "qwen2_style", {
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>"})

    # RoBERTa/GPT-2 style: ByteLevel with its own regex and a prefix space, lowercase, <s> ... </s>.
    t = Tokenizer(models.BPE())
    t.normalizer = normalizers.Lowercase()
    t.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    t.decoder = decoders.ByteLevel()
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=900, special_tokens=["<s>", "<pad>", "</s>", "<unk>"],
                                                     initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False))
    t.post_processor = processors.RobertaProcessing(("</s>", t.token_to_id("</s>")), ("<s>", t.token_to_id("<s>")))
    t.add_special_tokens([AddedToken("<mask>", lstrip=True, rstrip=True, normalized=False, special=True)])
    made["roberta_style"] = write_tokenizer(t, "roberta_style", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>"})

    # LLaMA-2 (legacy=false) style: Metaspace pre-tokenizer, byte fallback, fused <unk>, <s> template.
    byte_tokens = ["<0x%02X>" % b for b in range(256)]
    t = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    t.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first", split=False)
    t.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                   decoders.Strip(content=" ", left=1, right=0)])
    t.train_from_iterator(lines, trainers.BpeTrainer(vocab_size=1400, special_tokens=["<unk>", "<s>", "</s>"] + byte_tokens,
                                                     limit_alphabet=120, show_progress=False))
    t.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    d = write_tokenizer(t, "metaspace_style", {
        "tokenizer_class": "PreTrainedTokenizerFast", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"})
    # As in LLaMA's files, the byte tokens are ordinary vocabulary entries, not added tokens.
    path = os.path.join(d, "tokenizer.json")
    j = json.load(open(path, encoding="utf-8"))
    j["added_tokens"] = [a for a in j["added_tokens"] if a["content"] not in byte_tokens]
    json.dump(j, open(path, "w", encoding="utf-8"), ensure_ascii=False, indent=2)
    made["metaspace_style"] = d

    # SentencePiece model trained with Debian's spm_train (the demo's tokenizer route).
    with tempfile.TemporaryDirectory() as tmp:
        txt = os.path.join(tmp, "austen.txt")
        with open(txt, "w", encoding="utf-8") as f:
            for l in lines:
                f.write(l.replace("\n", " ") + "\n")
        prefix = os.path.join(tmp, "spm")
        subprocess.run(["spm_train", f"--input={txt}", f"--model_prefix={prefix}", "--vocab_size=600",
                        "--model_type=bpe", "--byte_fallback=true", "--character_coverage=0.9995",
                        "--normalization_rule_name=identity",
                        "--minloglevel=2"], check=True)
        data = open(prefix + ".model", "rb").read()
    with open(os.path.join(TOK_DIR, "spm_austen.model"), "wb") as f:
        f.write(data)
    return made


def check_equal(a, b, what):
    if a != b:
        sys.exit(f"reference libraries disagree on {what}:\n{a}\n{b}")


def main():
    T = megatron_module()
    import sentencepiece
    import tiktoken
    from tiktoken.load import data_gym_to_mergeable_bpe_ranks
    from tokenizers import Tokenizer

    fixtures = train_fixtures()
    out = {"generator": "tools/reference/tokenizer_reference.py", "texts": TEXTS, "tokenizers": {}}

    def record(name, tok, ids_fn=None, extra=None, needs_shared=False):
        ids = [ids_fn(t) if ids_fn else tok.tokenize(t) for t in TEXTS]
        decoded = [tok.detokenize(i) for i in ids]
        entry = {"vocab_size": tok.vocab_size, "eod": tok.eod, "ids": ids, "decoded": decoded, "needs_shared": needs_shared}
        try:
            entry["pad"] = tok.pad
        except Exception:
            entry["pad"] = -1
        if entry["pad"] is None:
            entry["pad"] = -1
        if extra:
            entry.update(extra)
        out["tokenizers"][name] = entry
        print(f"{name}: vocab {tok.vocab_size}, eod {tok.eod}", file=sys.stderr)

    # GPT2BPETokenizer (repo copy of GPT-2's files) vs tiktoken and HF tokenizers.
    gdir = os.path.join(REPO, "data", "tokenizers", "gpt2")
    vocab, merges = os.path.join(gdir, "vocab.json"), os.path.join(gdir, "merges.txt")
    g = megatron_tokenizer(T, tokenizer_type="GPT2BPETokenizer", vocab_file=vocab, merge_file=merges)
    enc = tiktoken.Encoding(name="gpt2_local",
                            pat_str=r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+""",
                            mergeable_ranks=data_gym_to_mergeable_bpe_ranks(merges, vocab), special_tokens={"<|endoftext|>": 50256})
    from tokenizers import models, pre_tokenizers
    hf = Tokenizer(models.BPE.from_file(vocab, merges))
    hf.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    for t in TEXTS:
        check_equal(g.tokenize(t), enc.encode_ordinary(t), f"GPT-2 {t!r} (Megatron vs tiktoken)")
        check_equal(g.tokenize(t), hf.encode(t).ids, f"GPT-2 {t!r} (Megatron vs tokenizers)")
    record("gpt2", g, extra={"files": ["data/tokenizers/gpt2/vocab.json", "data/tokenizers/gpt2/merges.txt"]})

    # HuggingFaceTokenizer: Megatron's class (transformers.AutoTokenizer) vs tokenizers directly.
    def hf_entry(name, path, needs_shared):
        m = megatron_tokenizer(T, tokenizer_type="HuggingFaceTokenizer", tokenizer_model=path)
        raw = Tokenizer.from_file(os.path.join(path, "tokenizer.json"))
        # transformers' PreTrainedTokenizerFast sets a top-level pre-tokenizer's add_prefix_space
        # to tokenizer_config.json's value (default False); Gale does the same.
        config = json.load(open(os.path.join(path, "tokenizer_config.json")))
        state = json.loads(raw.pre_tokenizer.__getstate__()) if raw.pre_tokenizer else {}
        if "add_prefix_space" in state and state["add_prefix_space"] != config.get("add_prefix_space", False):
            from tokenizers import pre_tokenizers as pt
            kind = state.pop("type")
            state["add_prefix_space"] = config.get("add_prefix_space", False)
            raw.pre_tokenizer = getattr(pt, kind)(**state)
        for t in TEXTS:
            check_equal(m.tokenize(t), raw.encode(t).ids, f"{name} {t!r} (Megatron vs tokenizers)")
        rel = os.path.relpath(path, REPO) if not needs_shared else "tokenizers/mistral-7b"
        record(name, m, extra={"files": [rel],
                               "decoded_tokenizers": [raw.decode(raw.encode(t).ids, skip_special_tokens=False) for t in TEXTS]},
               needs_shared=needs_shared)

    hf_entry("mistral", os.path.join(SHARED, "tokenizers", "mistral-7b"), True)
    for name in ["llama3_style", "qwen2_style", "roberta_style", "metaspace_style"]:
        hf_entry(name, fixtures[name], False)

    # SentencePiece variants.
    for model, tag, shared in [(os.path.join(TOK_DIR, "spm_austen.model"), "spm_austen", False),
                               (os.path.join(SHARED, "tokenizers", "sentencepiece", "test_model.model"), "spm_test", True)]:
        sp = sentencepiece.SentencePieceProcessor(model_file=model)
        for kind in ["SentencePieceTokenizer", "GPTSentencePieceTokenizer", "Llama2Tokenizer"]:
            m = megatron_tokenizer(T, tokenizer_type=kind, tokenizer_model=model, vocab_extra_ids=2 if kind == "SentencePieceTokenizer" else 0)
            if kind == "GPTSentencePieceTokenizer":
                for t in TEXTS:
                    check_equal(m.tokenize(t), sp.encode(t), f"{kind} {t!r}")
            rel = os.path.relpath(model, REPO) if not shared else "tokenizers/sentencepiece/test_model.model"
            record(f"{tag}/{kind}", m, extra={"files": [rel], "type": kind,
                                              "vocab_extra_ids": 2 if kind == "SentencePieceTokenizer" else 0},
                   needs_shared=shared)

    # NullTokenizer.
    n = megatron_tokenizer(T, tokenizer_type="NullTokenizer", vocab_size=1000)
    out["null"] = {"vocab_size": n.vocab_size, "eod": n.eod, "examples": [[s, n.tokenize(s)] for s in ["1 2 3", "7", "\t5\n", "+4 -2", "10\n 20", "0 999 1000"]]}

    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)", file=sys.stderr)


if __name__ == "__main__":
    main()
