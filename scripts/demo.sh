#!/usr/bin/env bash
# The demo: install, build, preprocess Jane Austen's novels with the GPT-2 tokenizer, train a small
# GPT on them for a few minutes (the loss falls from ~10.8), then generate text from the checkpoint
# and measure its perplexity on the held-out chapters.
# Usage: scripts/demo.sh [ITERATIONS]   (default 300; the work files go to ./demo-work)
set -euo pipefail
cd "$(dirname "$0")/.."
iters="${1:-300}"
scripts/install-deps.sh
scripts/build.sh
gale=build/bin/gale
work=demo-work
rm -rf "$work"
mkdir -p "$work"
tok=(--tokenizer-type GPT2BPETokenizer --vocab-file data/tokenizers/gpt2/vocab.json
     --merge-file data/tokenizers/gpt2/merges.txt)
model=(--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 256 --max-position-embeddings 256
       --attention-dropout 0 --hidden-dropout 0)

echo "== preprocess (Megatron's tools/preprocess_data.py, in C++)"
"$gale" preprocess --input data/corpus/austen.jsonl.gz --output-prefix "$work/austen" "${tok[@]}" \
  --append-eod --workers 2

echo "== pretrain (Megatron's pretrain_gpt.py flags; MindSpeed's fused kernels at level 2)"
"$gale" pretrain "${model[@]}" "${tok[@]}" --data-path "$work/austen_text_document" --split 98,2,0 \
  --micro-batch-size 8 --global-batch-size 8 --train-iters "$iters" \
  --lr 1e-3 --min-lr 1e-4 --lr-decay-style cosine --lr-warmup-iters 20 --weight-decay 0.1 --clip-grad 1.0 \
  --log-interval 20 --log-throughput --eval-interval 100 --eval-iters 5 \
  --use-flash-attn --cross-entropy-loss-fusion \
  --save "$work/checkpoints" --save-interval "$iters"

if "$gale" --help | grep -q '^  generate'; then
  echo "== generate (from the checkpoint just saved)"
  "$gale" generate "${model[@]}" "${tok[@]}" --load "$work/checkpoints" \
    --prompt "It is a truth universally acknowledged" --max-new-tokens 40 --temperature 0.8 --top-k 40
fi

if "$gale" --help | grep -q '^  evaluate'; then
  echo "== evaluate (perplexity on the last 5 chapters: the validation documents of --split 98,2,0)"
  zcat data/corpus/austen.jsonl.gz | tail -n 5 > "$work/held_out.jsonl"
  "$gale" evaluate "${model[@]}" "${tok[@]}" --load "$work/checkpoints" --task ppl \
    --task-data-path "$work/held_out.jsonl"
fi
