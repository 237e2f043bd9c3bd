# Checks `gale convert`'s Gale -> Qwen3NextForCausalLM export against transformers 5.x (manual; the
# figure is recorded in docs/formats/hf-conversion.md).
#
#   build/bin/gale convert --load-model-type hf --save-model-type gale --load-dir tests/data/hf/qwen3_next --save-dir /tmp/q3n/gale
#   build/bin/gale convert --load-model-type gale --save-model-type hf --load-dir /tmp/q3n/gale --save-dir /tmp/q3n/hf [--save-dtype bf16]
#   /tmp/hfyarn/bin/python tools/reference/hf_export_check_qwen3_next.py /tmp/q3n/hf
#
# Loads the exported directory with Qwen3NextForCausalLM.from_pretrained (strict: every tensor the
# class expects must be there, none left over), runs the fixture's tokens in float64 as
# hf_fixture_qwen3_next.py made the golden logits, and prints the largest |logit - golden| and the
# loss difference. Exits 1 when the load reports missing / unexpected keys or the logits differ by
# more than 1e-4.
#
#   /tmp/hfyarn/bin/python tools/reference/hf_export_check_qwen3_next.py DIR --score EOD VOCAB T1 T2 ...
#
# instead scores an export of a model Gale trained as `gale evaluate --task ppl` does (the mean
# negative log-likelihood of T1.. after EOD, softmax over the first VOCAB logits: the tokenizer's
# vocabulary) and prints the greedy continuation of T1.. (10 tokens), to compare with `gale
# evaluate` / `gale generate` on the Gale checkpoint.
import os
import sys

import torch
import transformers
from safetensors.torch import load_file

HERE = os.path.dirname(os.path.abspath(__file__))
GOLDEN = os.path.join(HERE, "..", "..", "tests", "data", "hf", "qwen3_next", "golden.safetensors")


def score(exported, eod, vocab, tokens):
    model = transformers.Qwen3NextForCausalLM.from_pretrained(
        exported, torch_dtype=torch.float64, experts_implementation="eager").eval()
    ids = torch.tensor([[eod] + tokens])
    with torch.no_grad():
        logits = model(ids).logits[0]
        nll = torch.nn.functional.cross_entropy(logits[:-1, :vocab], ids[0, 1:]).item()
        greedy = model.generate(torch.tensor([tokens]), max_new_tokens=10, do_sample=False)[0].tolist()
    print(f"tokens: {len(tokens)} | lm loss: {nll:.6E}")
    print("greedy:", " ".join(str(t) for t in greedy))


def main():
    exported = sys.argv[1]
    if len(sys.argv) > 2 and sys.argv[2] == "--score":
        score(exported, int(sys.argv[3]), int(sys.argv[4]), [int(t) for t in sys.argv[5:]])
        return
    golden = load_file(GOLDEN)
    model, info = transformers.Qwen3NextForCausalLM.from_pretrained(
        exported, torch_dtype=torch.float64, experts_implementation="eager", output_loading_info=True)
    model.eval()
    problems = {k: v for k, v in info.items() if v}
    print("loading info:", problems or "every tensor matched")
    tokens = golden["tokens"]
    with torch.no_grad():
        out = model(tokens.unsqueeze(0), labels=tokens.unsqueeze(0))
    diff = (out.logits[0].float() - golden["logits"]).abs().max().item()
    loss = abs(out.loss.item() - golden["loss"].item())
    print(f"max |logit - golden| {diff:.3g}, |loss - golden| {loss:.3g}")
    sys.exit(0 if not problems and diff < 1e-4 else 1)


if __name__ == "__main__":
    main()
