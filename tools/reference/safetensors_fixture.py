#!/usr/bin/env python3
"""Writes the safetensors test fixtures with the real `safetensors` Python package.

Gale's reader is tested against files it did not write itself: this script writes them with
Hugging Face's own writer (safetensors.torch.save_file) and lists every expected value in a JSON
sidecar, so the C++ test (tests/ckpt/safetensors_test.cc) needs no Python.

Run with a venv that sees Debian's torch and has the PyPI `safetensors` package (see README.md):
    /usr/bin/python3 -m venv --system-site-packages /tmp/gale-ref-venv
    /tmp/gale-ref-venv/bin/pip install safetensors==0.8.0
    /tmp/gale-ref-venv/bin/python tools/reference/safetensors_fixture.py [--out tests/data/safetensors]
    /tmp/gale-ref-venv/bin/python tools/reference/safetensors_fixture.py --check FILE...   # load files Gale wrote

Outputs (small, committed): hf_dtypes.safetensors + hf_dtypes.json.
"""
import argparse
import json
import math
import os
import sys

import torch
import safetensors
from safetensors import safe_open
from safetensors.torch import save_file

# name -> (torch dtype, safetensors dtype name, shape, values). Values are chosen to be exactly
# representable in their dtype, and include the edge cases a reader gets wrong: f16 subnormals,
# the largest f16, signed zero, infinities, NaN, integer extremes.
F16_VALUES = [0.0, -0.0, 1.0, -2.5, 65504.0, 2.0 ** -14, 2.0 ** -24, 3.0 * 2.0 ** -24, float("inf"), float("-inf"), float("nan"), 0.333251953125]
BF16_VALUES = [0.0, 1.0, -1.5, 2.0 ** 127 * 1.5, 2.0 ** -130, 0.0078125, float("inf"), 1.0 + 2.0 ** -7]
TENSORS = {
    "f64.matrix": (torch.float64, "F64", [2, 3], [0.1, -2.0, 1e300, -1e-300, math.pi, 5e-324]),
    "f32.cube": (torch.float32, "F32", [2, 2, 3], [float(i) * 0.25 - 1.0 for i in range(12)]),
    "f32.scalar": (torch.float32, "F32", [], [42.5]),
    "f32.empty": (torch.float32, "F32", [0, 3], []),
    "f16.vector": (torch.float16, "F16", [12], F16_VALUES),
    "bf16.vector": (torch.bfloat16, "BF16", [8], BF16_VALUES),
    "i64.vector": (torch.int64, "I64", [3], [-(2 ** 63), 2 ** 63 - 1, 7]),
    "i32.matrix": (torch.int32, "I32", [2, 2], [-(2 ** 31), 2 ** 31 - 1, 0, -5]),
    "i16.vector": (torch.int16, "I16", [3], [-32768, 32767, 12]),
    "i8.vector": (torch.int8, "I8", [4], [-128, 127, 0, -1]),
    "u8.vector": (torch.uint8, "U8", [5], [0, 1, 127, 128, 255]),
    "bool.vector": (torch.bool, "BOOL", [3], [True, False, True]),
}
METADATA = {"producer": "tools/reference/safetensors_fixture.py"}  # one key: HF orders keys randomly


def json_value(v):
    if isinstance(v, bool):
        return int(v)
    if isinstance(v, float):
        if math.isnan(v):
            return "nan"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return v


def write(out_dir):
    os.makedirs(out_dir, exist_ok=True)
    tensors = {}
    expected = []
    for name, (dtype, st_name, shape, values) in TENSORS.items():
        t = torch.tensor(values, dtype=dtype).reshape(shape)
        round_trip = t.to(torch.float64).flatten().tolist() if dtype.is_floating_point else t.flatten().tolist()
        for a, b in zip(round_trip, values):  # the values must be exact in their dtype
            assert (math.isnan(a) and math.isnan(b)) or a == b, (name, a, b)
        tensors[name] = t
        expected.append({"name": name, "dtype": st_name, "shape": shape, "values": [json_value(v) for v in values]})
    path = os.path.join(out_dir, "hf_dtypes.safetensors")
    save_file(tensors, path, metadata=METADATA)
    with open(os.path.join(out_dir, "hf_dtypes.json"), "w") as f:
        json.dump({"file": "hf_dtypes.safetensors", "writer": f"safetensors {safetensors.__version__} (Python)",
                   "metadata": METADATA, "tensors": expected}, f, indent=1)
        f.write("\n")
    print(f"wrote {path} ({os.path.getsize(path)} bytes) with safetensors {safetensors.__version__}")


def check(paths):
    for path in paths:
        with safe_open(path, "pt") as f:
            print(path, "metadata:", f.metadata())
            for k in f.keys():
                t = f.get_tensor(k)
                print(f"  {k}: {t.dtype} {list(t.shape)} first={t.flatten()[:4].tolist()}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default=os.path.join(os.path.dirname(__file__), "../../tests/data/safetensors"))
    ap.add_argument("--check", nargs="+", metavar="FILE", help="load files with the Python package and print them")
    args = ap.parse_args()
    if args.check:
        check(args.check)
    else:
        write(os.path.normpath(args.out))


if __name__ == "__main__":
    sys.exit(main())
