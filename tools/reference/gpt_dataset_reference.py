#!/usr/bin/python3
"""Golden values for Gale's dataset indices, computed with NumPy itself.

Run with Debian's interpreter, which has numpy 1.24:  /usr/bin/python3 tools/reference/gpt_dataset_reference.py
Writes tests/data/reference/gpt_indices_golden.json (small; committed, so CI needs no NumPy).

This is an independent, NumPy-based restatement of Megatron's algorithms as described in
shared/reference/megatron.md §3 (GPTDataset document/sample/shuffle indices, blending, splits):
the random streams come from numpy.random.RandomState / default_rng themselves, rounding from
Python's round(), sums from numpy.sum, so the C++ side is checked against the real generators.
"""
import json
import math
import os
import re
import sys

import numpy

OUT = os.path.join(os.path.dirname(__file__), "..", "..", "tests", "data", "reference", "gpt_indices_golden.json")


def num_epochs(tokens, num_samples, seq, extra):
    if num_samples is None:
        return 1
    e, t = 1, tokens
    while t < num_samples * seq + extra:
        e += 1
        t += tokens
    return e


def document_index(documents, epochs, rs, separate):
    if not separate or epochs == 1:
        d = numpy.mgrid[0:epochs, 0:len(documents)][1]
        d[:] = documents
        d = d.reshape(-1).astype(numpy.int32)
        rs.shuffle(d)
        return d
    first = document_index(documents, epochs - 1, rs, False)
    last = document_index(documents, 1, rs, False)
    return numpy.concatenate((first, last))


def sample_index(sizes, doc, seq, epochs, tokens, drop_last, extra):
    if drop_last:
        n = (epochs * tokens - extra) // seq
    else:
        n = int(math.ceil(numpy.float32(epochs * tokens - extra) / numpy.float32(seq)))
    out = [[0, 0]]
    p, off = 0, 0
    for _ in range(n):
        rem = seq + extra
        while rem != 0:
            length = int(sizes[doc[p]]) - off
            rem -= length
            if rem <= 0:
                off += rem + length - extra
                rem = 0
            else:
                if p == len(doc) - 1:
                    off = int(sizes[doc[p]]) - extra
                    break
                p += 1
                off = 0
        out.append([p, off])
    return out


def shuffle_index(num, total, rs):
    dtype = numpy.uint32 if total < numpy.iinfo(numpy.uint32).max - 1 else numpy.int64
    a = numpy.arange(0, num, dtype=dtype)
    rs.shuffle(a)
    if num == total:
        return a
    b = numpy.arange(num, total, dtype=dtype)
    rs.shuffle(b)
    return numpy.concatenate((a, b))


def gpt_indices(sizes, beg, end, seq, num_samples, seed, extra=1, drop_last=True):
    docs = numpy.arange(beg, end, dtype=numpy.int32)
    tokens = int(numpy.sum(sizes[docs]))
    e = num_epochs(tokens, num_samples, seq, extra)
    separate = False
    if e > 1:
        sans = ((e - 1) * tokens - extra) // seq
        per = (tokens - extra) // seq
        separate = (num_samples - sans) < int(0.80 * per)
    rs = numpy.random.RandomState(seed)
    doc = document_index(docs, e, rs, separate)
    si = sample_index(sizes, doc, seq, e, tokens, drop_last, extra)
    total = len(si) - 1
    if separate:
        sh = shuffle_index(((e - 1) * tokens - extra) // seq, total, rs)
    else:
        sh = shuffle_index(total, total, rs)
    return {"epochs": e, "separate": bool(separate), "document_index": doc.tolist(), "sample_index": si,
            "shuffle_index": [int(x) for x in sh]}


def blending(weights, size):
    w = numpy.array(weights, dtype=numpy.float64)
    w = (w / numpy.sum(w)).tolist()
    count = [0] * len(w)
    di, dsi = [], []
    for t in range(size):
        x = max(float(t), 1.0)
        best, err = 0, w[0] * x - count[0]
        for i in range(1, len(w)):
            e = w[i] * x - count[i]
            if e > err:
                best, err = i, e
        di.append(best)
        dsi.append(count[best])
        count[best] += 1
    return di, dsi


def split_ranges(split, numel):
    v = list(map(float, re.findall(r"[.0-9]+", split)))
    v = v + [0.0] * (3 - len(v))
    a = numpy.array(v, dtype=numpy.float64)
    v = (a / numpy.sum(a)).tolist()
    ends = [0]
    for x in v:
        ends.append(ends[-1] + x)
    out = []
    for i in range(3):
        if ends[i + 1] <= ends[i]:
            out.append(None)
        else:
            out.append([int(round(ends[i] * float(numel))), int(round(ends[i + 1] * float(numel)))])
    return out


def main():
    rng = numpy.random.RandomState(20240601)
    cases = []
    for c in range(40):
        n = int(rng.randint(1, 40))
        sizes = rng.randint(1, 30, size=n).astype(numpy.int32)
        seq = int(rng.randint(2, 20))
        beg = int(rng.randint(0, n))
        end = int(rng.randint(beg + 1, n + 1))
        tokens = int(sizes[beg:end].sum())
        if tokens <= 1:
            continue
        per = (tokens - 1) // seq
        choice = c % 4
        num_samples = None if choice == 0 else int(rng.randint(0, max(1, per) * (1 + 4 * (choice == 3)) + 3))
        seed = int(rng.randint(1, 2**31 - 1)) if c % 5 else 1234
        drop_last = c % 7 != 3
        case = {"sizes": sizes.tolist(), "begin": beg, "end": end, "seq_length": seq, "num_samples": num_samples,
                "seed": seed, "drop_last": drop_last}
        case.update(gpt_indices(sizes, beg, end, seq, num_samples, seed, drop_last=drop_last))
        cases.append(case)

    blends = []
    for weights, size in [([0.3, 0.7], 10), ([1, 1, 1], 25), ([0.5, 0.2, 0.2, 0.1], 40),
                          ([3.0, 1e-3, 7.5, 0.25, 2, 2, 2, 9, 1], 60)]:
        di, dsi = blending(weights, size)
        blends.append({"weights": weights, "size": size, "dataset_index": di, "dataset_sample_index": dsi})

    splits = []
    for split, numel in [("969, 30, 1", 500), ("969,30,1", 1000), ("99,1,0", 10), ("1,1,1", 100000),
                         ("0.5 0.25 0.25", 7), ("1,2", 3), ("2,5,3", 11), ("1", 8)]:
        splits.append({"split": split, "numel": numel, "ranges": split_ranges(split, numel)})

    sums = []
    srng = numpy.random.RandomState(7)
    for n in [1, 2, 3, 7, 8, 9, 15, 16, 17, 100, 129, 300]:
        a = (srng.random_sample(n) * 10.0 ** srng.randint(-3, 4, size=n)).tolist()
        sums.append({"values": a, "sum": float(numpy.sum(numpy.array(a)))})

    mock = numpy.random.default_rng(0).integers(low=1, high=4096, size=100000, dtype=numpy.int32)
    rng1 = numpy.random.default_rng(12345)
    raw = [int(x) for x in rng1.bit_generator.random_raw(4)]
    shuffles = []
    for seed, n in [(0, 10), (1234, 100), (2**32 - 1, 33), (42, 1000)]:
        rs = numpy.random.RandomState(seed)
        a = numpy.arange(n, dtype=numpy.int32)
        rs.shuffle(a)
        b = numpy.arange(n // 2, dtype=numpy.uint32)
        rs.shuffle(b)
        shuffles.append({"seed": seed, "n": n, "first": a.tolist(), "second": b.tolist()})

    out = {
        "generator": "tools/reference/gpt_dataset_reference.py with numpy " + numpy.__version__,
        "gpt_indices": cases,
        "blending": blends,
        "splits": splits,
        "numpy_sum": sums,
        "mock_lengths": {"first": mock[:64].tolist(), "last": mock[-16:].tolist(), "sum": int(mock.sum(dtype=numpy.int64)),
                         "weighted_sum_mod_1e9": int((mock.astype(numpy.int64) * numpy.arange(1, 100001)).sum() % 10**9)},
        "pcg64_raw_seed_12345": [str(x) for x in raw],
        "random_state_shuffles": shuffles,
    }
    with open(OUT, "w") as f:
        json.dump(out, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT}: {len(cases)} index cases, {os.path.getsize(OUT)} bytes", file=sys.stderr)


if __name__ == "__main__":
    main()
