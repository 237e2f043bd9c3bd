#!/usr/bin/env python3
"""Golden sentence splits of NLTK's Punkt tokenizer, and Megatron's `--split-sentences` output.

Megatron's tools/preprocess_data.py splits documents with NLTK's PunktSentenceTokenizer (the
pre-trained `tokenizers/punkt/PY3/<lang>.pickle` parameters; `--keep-newlines` swaps in its
CustomLanguageVars). The algorithm is NLTK 3.8.1's (3.9 has the same tokenizer code and reads the
same parameters from `tokenizers/punkt_tab/<lang>/`). This script, with nltk==3.8.1:

1. trains Punkt parameters on the bundled Austen corpus (NLTK's own english model cannot be
   downloaded here), adds a few abbreviations and collocations so that every heuristic is
   exercised, and writes them as NLTK 3.9's punkt_tab files (sorted, so the files are stable) under
   tests/data/nltk_data/tokenizers/punkt_tab/english/;
2. writes tests/data/reference/punkt_golden.json: texts (hand-written cases, corpus excerpts and
   random strings over every character class the algorithm looks at) with NLTK's sentence spans
   (code-point offsets) for the standard and the keep-newlines variants;
3. runs Megatron's preprocess_data.py (core_v0.12.1) with --split-sentences, with and without
   --keep-newlines, and keeps its .bin/.idx (tests/data/reference/preprocess/megatron_*_sentence.*).

  MEGATRON_LM=/path/to/Megatron-LM@core_v0.12.1 /tmp/megvenv/bin/python tools/reference/punkt_reference.py
(the environment of tokenizer_reference.py plus `pip install nltk==3.8.1`).
"""
import json
import os
import pickle
import random
import shutil
import sys
import tempfile

import nltk
from nltk.tokenize.punkt import PunktLanguageVars, PunktSentenceTokenizer, PunktTrainer

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))
CORPUS = os.path.join(REPO, "..", "shared", "data", "corpus")
NLTK_DATA = os.path.join(REPO, "tests", "data", "nltk_data")
TAB_DIR = os.path.join(NLTK_DATA, "tokenizers", "punkt_tab", "english")
GOLDEN = os.path.join(REPO, "tests", "data", "reference", "punkt_golden.json")
PREPROCESS = os.path.join(REPO, "tests", "data", "reference", "preprocess")
sys.path.insert(0, HERE)


class CustomLanguageVars(PunktLanguageVars):
    """Megatron's preprocess_data.py CustomLanguageVars (for --keep-newlines): the period context
    takes the word before the period, and the whitespace after it, into the match."""
    _period_context_fmt = r"""
        \S*                          # some word material
        %(SentEndChars)s             # a potential sentence ending
        \s*                       #  <-- THIS is what I changed
        (?=(?P<after_tok>
            %(NonWord)s              # either other punctuation
            |
            (?P<next_tok>\S+)     #  <-- Normally you would have \s+ here
        ))"""


def corpus_docs(name):
    with open(os.path.join(CORPUS, name), encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


def train_params():
    trainer = PunktTrainer()
    trainer.train("\n\n".join(corpus_docs("austen.jsonl")), finalize=True)
    params = trainer.get_params()
    params.abbrev_types.update({"mr", "mrs", "dr", "e.g", "i.e", "u.s", "no", "st", "jan"})
    params.collocations.update({("##number##", "chapter"), ("st", "james"), ("jan", "##number##"), ("gone", "home"), ("end", "yes")})
    return params


def write_tab(params):
    os.makedirs(TAB_DIR, exist_ok=True)
    with open(os.path.join(TAB_DIR, "collocations.tab"), "w", encoding="utf-8") as f:
        f.write("\n".join("\t".join(c) for c in sorted(params.collocations)))
    with open(os.path.join(TAB_DIR, "sent_starters.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(sorted(params.sent_starters)))
    with open(os.path.join(TAB_DIR, "abbrev_types.txt"), "w", encoding="utf-8") as f:
        f.write("\n".join(sorted(params.abbrev_types)))
    with open(os.path.join(TAB_DIR, "ortho_context.tab"), "w", encoding="utf-8") as f:
        f.write("\n".join(f"{k}\t{v}" for k, v in sorted(params.ortho_context.items())))


HAND = [
    "",
    "   ",
    "One sentence without an end",
    "Mr. Smith went to Washington. He arrived at 3 p.m. on Jan. 5. Then he left!",
    "Punkt knows that the periods in Mr. Smith and Johann S. Bach\ndo not mark sentence boundaries.  And "
    "sometimes sentences\ncan start with non-capitalized words.  i is a good variable\nname.",
    "(How does it deal with this parenthesis?)  \"It should be part of the\nprevious sentence.\" \"(And the "
    "same with this one.)\" ('And this one!')\n\"('(And (this)) '?)\" [(and this. )]",
    "Very bad acting!!! I promise. Really?! Yes... maybe. . . no.",
    "He said -- quietly -- that it was over. It was. 12.5 percent. 3. The list.",
    "Chapter 1.\n\nIt was a dark night. St. James was quiet.\n\n\nThe end.",
    "e.g. this one. i.e. that one. U.S. policy. No. 5 is here.",
    "Trailing spaces.   \n\n  ",
    "\n\nLeading newlines. Second.",
    "Quotes.\" Next. 'Single.' Next) and more] and {braces}. Done.",
    "Ellipsis... and more.... Then.. two.",
    "Number 12. 13. and 1,000.5 then -4. Fin.",
    "Émile went to the ÉCOLE. Straße. İstanbul is large. Ωmega. ǅemal came. Ⅻ. ² apples. ٣. ª.",
    "tab\tseparated.\tNext\ttoken. A\u00a0non-breaking. Para\u2029graph. Odd\x1cseparator. Done.",
    "a.b.c. d.e. F. G. Bach. X.",
    "Why? Because! Fine.\r\nWindows line. End.",
    "words_with_underscore. _x. __init__. Next.",
    "Dr. Who? Dr. No! Mrs. Jones, Mr. Jones; St. Paul: done.",
    "A sentence.)\n(Another one.) More.",
    "---- dashes -- and. -- Next.",
    ". . . Spaced ellipsis . . . again. Then.",
    "?!?! ... !!! End.",
    "x." * 50,
    "Hello.World. No space.Here.",
    "He left.\nShe stayed.\n\nThey talked.\n",
    "He had gone. Home was far. It was the end. Yes, the end. Gone. Home.",
    "Wait . . . Then go. . . . And more . . . x.",
]

PIECES = [
    "Mr", "mrs", "Dr", "Smith", "the", "The", "J", "S", "U.S", "e.g", "i.e", "3", "12.5", "1,000", "-4", "Chapter",
    "chapter", "i", "Jan", "St", "James", "no", "No", "and", "But", "Emma", "elinor", "Émile", "ÉCOLE", "straße",
    "İstanbul", "Ωmega", "ǅemal", "²", "٣", "Ⅻ", "ª", "_x", "x_", "über", "a", "Z",
    ".", ".", ".", "?", "!", ",", ";", ":", "\"", "'", "(", ")", "[", "]", "{", "}", "--", "...", "-", ". . .", "..",
    "&", "#", "*", "@", "`",
    " ", " ", " ", "  ", "\n", "\n\n", "\t", "\r\n", "\u00a0", "\u2029", "\x1c", "\u3000",
]


def random_texts(rng, n):
    out = []
    for _ in range(n):
        k = rng.randint(0, 40)
        out.append("".join(rng.choice(PIECES) for _ in range(k)))
    return out


def spans(tok, text):
    return [list(s) for s in tok.span_tokenize(text)]


def cp_spans(tok, text):
    # span_tokenize gives Python string (code point) offsets already.
    return spans(tok, text)


def write_golden(params):
    rng = random.Random(1234)
    texts = list(HAND)
    for name, count in [("austen.jsonl", 10), ("kjv.jsonl", 6)]:
        docs = corpus_docs(name)
        for i in range(count):
            doc = docs[(i * 7) % len(docs)]
            start = (i * 1237) % max(1, len(doc) - 5000)
            texts.append(doc[start:start + 5000])
    texts += random_texts(rng, 600)
    standard = PunktSentenceTokenizer(params)
    keep = PunktSentenceTokenizer(train_text=params, lang_vars=CustomLanguageVars())
    golden = {
        "nltk": nltk.__version__,
        "texts": texts,
        "standard": [cp_spans(standard, t) for t in texts],
        "keep_newlines": [cp_spans(keep, t) for t in texts],
    }
    with open(GOLDEN, "w", encoding="utf-8") as f:
        json.dump(golden, f, ensure_ascii=False, separators=(",", ":"))
        f.write("\n")


PREPROCESS_RECORDS = [
    {"text": HAND[3]},
    {"text": HAND[4]},
    {"text": ""},
    {"text": HAND[5]},
    {"text": HAND[15]},
    {"text": HAND[27]},
]


def write_preprocess(params):
    import megatron_stubs  # noqa: E402
    nltk.download = lambda *args, **kwargs: True  # offline: the parameters are written below
    gpt2 = os.path.join(REPO, "data", "tokenizers", "gpt2")
    docs = corpus_docs("austen.jsonl")
    records = PREPROCESS_RECORDS + [{"text": docs[3][:3000]}, {"text": docs[40][:3000]}]
    with tempfile.TemporaryDirectory() as tmp:
        data = os.path.join(tmp, "nltk_data")
        pickle_dir = os.path.join(data, "tokenizers", "punkt", "PY3")
        os.makedirs(pickle_dir)
        with open(os.path.join(pickle_dir, "english.pickle"), "wb") as f:
            pickle.dump(PunktSentenceTokenizer(params), f, protocol=2)
        os.environ["NLTK_DATA"] = data
        jsonl = os.path.join(PREPROCESS, "split_input.jsonl")
        with open(jsonl, "w", encoding="utf-8") as f:
            for r in records:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        for name, extra in [("gpt2_eod_split", []), ("gpt2_eod_split_keep_newlines", ["--keep-newlines"])]:
            work = os.path.join(tmp, name)
            os.makedirs(work)
            shutil.copy(jsonl, os.path.join(work, "input.jsonl"))
            argv = ["--input", os.path.join(work, "input.jsonl"), "--output-prefix", os.path.join(work, "out"),
                    "--json-keys", "text", "--workers", "1", "--split-sentences", "--tokenizer-type",
                    "GPT2BPETokenizer", "--vocab-file", os.path.join(gpt2, "vocab.json"), "--merge-file",
                    os.path.join(gpt2, "merges.txt"), "--append-eod"] + extra
            # With one partition Megatron's first run only writes input_ss.jsonl; the second encodes it.
            megatron_stubs.run_preprocess_data(argv)
            megatron_stubs.run_preprocess_data(argv)
            for ext in ["bin", "idx"]:
                shutil.copy(os.path.join(work, f"out_text_sentence.{ext}"),
                            os.path.join(PREPROCESS, f"megatron_{name}_text_sentence.{ext}"))


def main():
    if nltk.__version__ != "3.8.1":
        print(f"warning: nltk {nltk.__version__}; the goldens were made with 3.8.1", file=sys.stderr)
    params = train_params()
    write_tab(params)
    write_golden(params)
    write_preprocess(params)
    print("wrote", TAB_DIR, GOLDEN, PREPROCESS, file=sys.stderr)


if __name__ == "__main__":
    main()
