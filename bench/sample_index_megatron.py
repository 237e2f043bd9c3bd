#!/usr/bin/env python3
"""Baseline for build/bench/sample_index_bench: Megatron's own index builders on the same inputs.

Times megatron/core/datasets/gpt_dataset.py's _build_document_index and _build_shuffle_index and
helpers.cpp's build_sample_idx (compiled as in tools/reference/gpt_samples_reference.py) for the
benchmark's four configurations of 10^8 tokens.
  MEGATRON_LM=/path/to/Megatron-LM@core_v0.12.1 /tmp/megvenv/bin/python bench/sample_index_megatron.py
"""
import os
import sys
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tools", "reference"))
import megatron_stubs  # noqa: E402

megatron_stubs.install()
import numpy  # noqa: E402
from megatron.core.datasets import helpers  # noqa: E402
from megatron.core.datasets.gpt_dataset import _build_document_index, _build_shuffle_index  # noqa: E402

TOKENS = 100_000_000


def lengths_for(mean):
    rng = numpy.random.default_rng(0)
    out, total = [], 0
    while total < TOKENS:
        batch = rng.integers(1, 2 * mean, size=4096, dtype=numpy.int32)
        cum = numpy.cumsum(batch, dtype=numpy.int64) + total
        stop = numpy.searchsorted(cum, TOKENS)  # first index reaching TOKENS
        if stop < len(batch):
            out.append(batch[: stop + 1])
            break
        out.append(batch)
        total = int(cum[-1])
    return numpy.concatenate(out)


for mean, seq, epochs in [(2048, 2048, 1), (500, 2048, 1), (500, 1024, 3), (100, 128, 1)]:
    sizes = lengths_for(mean)
    tokens = int(sizes.sum())
    num_samples = epochs * (TOKENS // seq) - 10
    e = 1
    while e * tokens < num_samples * seq + 1:
        e += 1
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        rs = numpy.random.RandomState(1234)
        doc = _build_document_index(numpy.arange(len(sizes), dtype=numpy.int32), e, rs, False)
        sample = helpers.build_sample_idx(sizes, doc, seq, e, tokens, True, 1)
        shuffle = _build_shuffle_index(sample.shape[0] - 1, sample.shape[0] - 1, rs)
        best = min(best, time.perf_counter() - t0)
    print(f"Megatron mean_doc:{mean}/seq:{seq}/epochs:{epochs}: {best * 1000:.1f} ms, {len(sizes)} documents, "
          f"{sample.shape[0] - 1} samples")
