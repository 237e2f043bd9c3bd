#!/usr/bin/env python3
"""Golden GPT samples with --dataloader-inter-document-masking from Megatron-LM main's own GPTDataset.

Runs GPTDataset.__getitem__ (and _query_document_sample_shuffle_indices, _get_ltor_masks_and_position_ids)
of Megatron-LM main (commit d98e8a64) unchanged on hand-made sample boundaries over five small
documents (with and without a final EOD): a sample across documents, one across three, a short last
sample that Megatron pads, one whose last part is only the extra label token, and one inside a
single document. The index building (helpers.cpp) is not run: those boundaries are given as the
sample_index rows, since Gale's indices are checked against Megatron's elsewhere
(gpt_samples_reference.py). Writes tests/data/megatron_sft/inter_document.json: per flag set and
sample, the S + 1 raw ids, the parts' lengths, and Megatron's tokens, labels, loss_mask,
position_ids and cu_seqlens.

  MEGATRON_LM=/tmp/meg_head /tmp/sft_venv/bin/python tools/reference/megatron_inter_document_reference.py
(the environment of megatron_sft_reference.py). Deterministic.
"""
import json
import os
import sys
import types

import numpy

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import megatron_sft_reference as ref  # noqa: E402

EOD = 99
DOCS = [[1, 2, 3, EOD], [4, 5, 6, 7, 8], [9, EOD], [10, 11, 12, 13, 14, 15, 16, 17, 18, 19], [20, 21, EOD]]
S = 8
# sample_index rows (document_index position, offset); sample k reads rows SHUFFLE[k] and SHUFFLE[k] + 1.
ROWS = [(0, 0), (1, 4), (3, 5), (4, 2), (2, 0), (3, 6), (0, 1), (2, 0), (3, 1), (3, 8)]
SHUFFLE = [0, 1, 2, 4, 6, 8]
FLAGS = [
    {"name": "plain", "reset_position_ids": False, "reset_attention_mask": False, "eod_mask_loss": False},
    {"name": "resets", "reset_position_ids": True, "reset_attention_mask": True, "eod_mask_loss": True},
]


class Docs:
    def get(self, idx, offset=0, length=None):
        d = DOCS[idx]
        return numpy.array(d[offset:] if length is None else d[offset:offset + length], dtype=numpy.int32)


def main():
    ref.install_megatron()
    from megatron.core.datasets.gpt_dataset import GPTDataset

    out = {"seq_length": S, "eod": EOD, "pad": -1, "flags": []}
    for flags in FLAGS:
        ds = object.__new__(GPTDataset)
        ds.dataset = Docs()
        ds.config = types.SimpleNamespace(sequence_length=S, add_extra_token_to_sequence=True,
                                          tokenizer=types.SimpleNamespace(eod=EOD), create_attention_mask=False,
                                          inter_document_masking=True, reset_position_ids=flags["reset_position_ids"],
                                          reset_attention_mask=flags["reset_attention_mask"],
                                          eod_mask_loss=flags["eod_mask_loss"])
        ds.document_index = numpy.arange(len(DOCS), dtype=numpy.int32)
        ds.sample_index = numpy.array(ROWS, dtype=numpy.int64)
        ds.shuffle_index = numpy.array(SHUFFLE, dtype=numpy.int64)
        ds._pad_token_id = -1
        ds.masks_and_position_ids_are_cacheable = False
        ds.masks_and_position_ids_are_cached = False
        samples = []
        for k in range(len(SHUFFLE)):
            text, _, parts = ds._query_document_sample_shuffle_indices(k)
            s = ds[k]
            cu = s["cu_seqlens"].tolist()
            cu = cu[: cu.index(S) + 1]
            samples.append({"text": [int(v) for v in text], "parts": [int(v) for v in parts],
                            "tokens": s["tokens"].tolist(), "labels": s["labels"].tolist(),
                            "loss_mask": [int(v) for v in s["loss_mask"].tolist()],
                            "position_ids": s["position_ids"].tolist(), "cu_seqlens": cu})
        out["flags"].append({**flags, "samples": samples})
    with open(os.path.join(ref.OUT, "inter_document.json"), "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")


if __name__ == "__main__":
    main()
