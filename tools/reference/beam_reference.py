# Beam-search fixtures for `gale generate --num-beams N`: the tiny Hugging Face models of
# tests/data/hf/ continue their golden prompt by beam search under Megatron's rules, run here over
# transformers' logits.
#
#   /tmp/convvenv/bin/python tools/reference/beam_reference.py   # writes tests/data/hf/<name>/beam.json
#
# (the venv of hf_fixture.py: Debian 12's python3-torch 1.13 + transformers 4.40.2). The rules
# (Megatron's text-generation beam search, which MindSpeed-LLM's beam_search task runs): the first
# step expands the prompt alone; each step ranks every (beam, token) by the beam's summed log-prob
# plus the token's (log-softmax in float64), walks the best 2N; the stop token (Gale's
# NullTokenizer eod = --vocab-size = 99) ends a hypothesis only from the first N ranks, scored
# sum / generated^length_penalty with the stop token counted and not kept; other tokens continue
# until N beams are chosen; the search stops when N hypotheses are kept and the step's best
# candidate, as if it ended there, is no better than the worst kept; at the last step the open beams
# join the hypotheses. Every case also records transformers' own generate(num_beams=N) output for
# comparison ("hf_tokens"; it uses other bookkeeping for finished hypotheses, so it may differ).
import json
import math
import os

import torch
import transformers
from safetensors.torch import load_file

HF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "hf")
STOP = 99
CASES = [(2, 6, 1.0), (3, 6, 1.0), (4, 8, 0.5)]  # (beams, max new tokens, length penalty)


def log_probs(model, ids):
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, -1].double()
    return torch.log_softmax(logits, dim=0).tolist()


class Hyps:
    def __init__(self, n, lp):
        self.n, self.lp, self.kept, self.worst = n, lp, [], 1e9

    def add(self, tokens, total, generated):
        score = total / generated ** self.lp
        if len(self.kept) >= self.n and score <= self.worst:
            return
        self.kept.append((score, tokens))
        if len(self.kept) > self.n:
            order = sorted(range(len(self.kept)), key=lambda i: self.kept[i][0])  # stable
            self.worst = self.kept[order[1]][0]
            del self.kept[order[0]]
        else:
            self.worst = min(self.worst, score)

    def done(self, best, generated):
        return len(self.kept) >= self.n and self.worst >= best / generated ** self.lp


def beam(model, prompt, n, steps, lp):
    hyps = Hyps(n, lp)
    beams = [([], 0.0)]
    done = False
    step = 0
    while step < steps:
        cands = []
        for b, (seq, total) in enumerate(beams):
            for v, lpv in enumerate(log_probs(model, prompt + seq)):
                cands.append((total + lpv, b, v))
        cands.sort(key=lambda c: (-c[0], c[1], c[2]))
        nxt = []
        for rank, (score, b, v) in enumerate(cands[:2 * n]):
            if len(nxt) == n:
                break
            if v == STOP:
                if rank < n:
                    hyps.add(beams[b][0], score, step + 1)
            else:
                nxt.append((beams[b][0] + [v], score))
        done = hyps.done(cands[0][0], step + 1)
        beams = nxt
        step += 1
        if done:
            break
    if not done:
        for seq, total in beams:
            hyps.add(seq, total, max(step, 1))
    best = max(hyps.kept, key=lambda h: h[0])  # the first of equals
    return best[1], best[0]


def main():
    for name, cls in [("gpt2", transformers.GPT2LMHeadModel), ("llama", transformers.LlamaForCausalLM)]:
        d = os.path.join(HF, name)
        model = cls.from_pretrained(d, torch_dtype=torch.float32).eval()
        prompt = load_file(os.path.join(d, "golden.safetensors"))["tokens"].tolist()
        cases = []
        for n, steps, lp in CASES:
            tokens, score = beam(model, prompt, n, steps, lp)
            with torch.no_grad():
                hf = model.generate(torch.tensor([prompt]), num_beams=n, do_sample=False, max_new_tokens=steps,
                                    length_penalty=lp, early_stopping=False, eos_token_id=STOP, pad_token_id=0)
            hf_tokens = [t for t in hf[0, len(prompt):].tolist()]
            cases.append({"num_beams": n, "max_new_tokens": steps, "length_penalty": lp, "tokens": tokens,
                          "score": score, "hf_tokens": hf_tokens})
            print(f"{name}: beams {n} lp {lp}: {tokens} score {score:.6f}; transformers {hf_tokens}")
        with open(os.path.join(d, "beam.json"), "w") as f:
            json.dump({"prompt": prompt, "stop_token": STOP, "cases": cases}, f, indent=1)
            f.write("\n")


if __name__ == "__main__":
    main()
