#!/usr/bin/env bash
# Preprocessing throughput: `gale preprocess` (GPT-2 BPE) at 1 and 2 workers, next to Hugging Face
# `tokenizers` (single thread) and, when MEGATRON_LM is set, Megatron's tools/preprocess_data.py,
# all on the same ~10 MB jsonl (Austen + King James Bible, from ../shared/data/corpus).
#
# Usage: bench/preprocess.sh [PYTHON]
#   PYTHON: an interpreter with the PyPI packages `tokenizers` (and numpy + torch for Megatron),
#           default /tmp/megvenv/bin/python (see tools/reference/tokenizer_reference.py for its setup).
#   MEGATRON_LM=/path/to/Megatron-LM@core_v0.12.1 adds the Megatron rows.
# Prints one line per run: tokens, seconds, tokens/s. Run it on a quiet machine (check `uptime`).
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${1:-/tmp/megvenv/bin/python}
GALE=build/bin/gale
CORPUS=../shared/data/corpus
WORK=$(mktemp -d /tmp/gale-bench-preprocess.XXXXXX)
trap 'rm -rf "$WORK"' EXIT
VOCAB=data/tokenizers/gpt2/vocab.json
MERGES=data/tokenizers/gpt2/merges.txt
[[ -x $GALE ]] || { echo "build gale first (scripts/build.sh)"; exit 1; }
[[ -f $CORPUS/austen.jsonl ]] || { echo "needs $CORPUS/austen.jsonl and kjv.jsonl"; exit 1; }

# ~10 MB: Austen, the KJV, then Austen's first 120 chapters again.
cat "$CORPUS/austen.jsonl" "$CORPUS/kjv.jsonl" > "$WORK/input.jsonl"
head -n 120 "$CORPUS/austen.jsonl" >> "$WORK/input.jsonl"
echo "input: $(wc -c < "$WORK/input.jsonl") bytes, $(wc -l < "$WORK/input.jsonl") documents; load: $(cut -d' ' -f1-3 /proc/loadavg)"

for workers in 1 2; do
  best=""
  for rep in 1 2 3; do  # best of 3 (the machine may be shared)
    out=$($GALE preprocess --input "$WORK/input.jsonl" --output-prefix "$WORK/gale$workers" --tokenizer-type GPT2BPETokenizer \
          --vocab-file $VOCAB --merge-file $MERGES --append-eod --workers $workers --log-interval 100000 2>/dev/null | tail -1)
    rate=$(echo "$out" | sed -E 's/.* ([0-9]+) tokens\/s.*/\1/')
    if [[ -z $best || $rate -gt $(echo "$best" | sed -E 's/.* ([0-9]+) tokens\/s.*/\1/') ]]; then best=$out; fi
  done
  echo "gale preprocess, $workers worker(s), best of 3: $best"
done

if "$PY" -c "import tokenizers" 2>/dev/null; then
  RAYON_NUM_THREADS=1 "$PY" - "$WORK/input.jsonl" $VOCAB $MERGES <<'PYEOF'
import json, sys, time
from tokenizers import Tokenizer, models, pre_tokenizers
path, vocab, merges = sys.argv[1:4]
tok = Tokenizer(models.BPE.from_file(vocab, merges))
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
dt = float("inf")
for rep in range(3):  # best of 3
    t0 = time.perf_counter()
    n = 0
    with open(path, encoding="utf-8") as f:
        for line in f:
            n += len(tok.encode(json.loads(line)["text"]).ids) + 1  # + EOD, as --append-eod
    dt = min(dt, time.perf_counter() - t0)
import tokenizers
print(f"HF tokenizers {tokenizers.__version__}, 1 thread, best of 3 (json.loads + encode per document): {n} tokens, {dt:.2f} s: {n/dt:.0f} tokens/s")
PYEOF
else
  echo "HF tokenizers: skipped ($PY has no 'tokenizers'; pass an interpreter that has it)"
fi

if [[ -n "${MEGATRON_LM:-}" ]]; then
  for workers in 1 2; do
    t0=$(date +%s.%N)
    "$PY" tools/reference/megatron_stubs.py --input "$WORK/input.jsonl" --output-prefix "$WORK/megatron$workers" \
      --tokenizer-type GPT2BPETokenizer --vocab-file $VOCAB --merge-file $MERGES --append-eod --workers $workers \
      --log-interval 100000 >/dev/null 2>&1
    t1=$(date +%s.%N)
    n=$($GALE data-samples --help >/dev/null 2>&1; "$PY" -c "import os,sys; print(os.path.getsize(sys.argv[1])//2)" "$WORK/megatron${workers}_text_document.bin")
    echo "Megatron preprocess_data.py, $workers worker(s): $n tokens, $(echo "$t1 - $t0" | bc) s: $(echo "$n / ($t1 - $t0)" | bc) tokens/s (includes Python start-up)"
    cmp -s "$WORK/megatron${workers}_text_document.bin" "$WORK/gale1_text_document.bin" && \
      cmp -s "$WORK/megatron${workers}_text_document.idx" "$WORK/gale1_text_document.idx" && echo "  output byte-identical to gale's"
  done
fi
