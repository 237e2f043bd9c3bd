# TensorBoard event-file fixture for tests/core/tensorboard_writer_test.cc: torch's SummaryWriter
# (what Megatron's --tensorboard-dir uses) writes a few scalars with fixed wall times and steps;
# the records after the first (the "brain.Event:2" file-version record, whose wall time is the
# clock's) are committed as tests/data/reference/tensorboard/scalars.records.
#
#   /tmp/tv/bin/python tools/reference/tensorboard_reference.py
#
# (torch 2.5.1 and tensorboard 2.21.0 from PyPI). The scalars cover a zero step and value, a
# negative value, a value float32 rounds, a large step, a non-ASCII tag, NaN and infinity.
import glob
import math
import os
import struct
import tempfile

from torch.utils.tensorboard import SummaryWriter

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference",
                   "tensorboard", "scalars.records")

# (tag, value, step, wall time): the C++ test writes the same list.
SCALARS = [
    ("lm loss", 10.8125, 1, 1700000000.25),
    ("learning-rate", 0.0, 0, 1700000000.5),
    ("learning-rate vs samples", 6e-4, 320, 1700000001.0),
    ("grad-norm", -1.0 / 3.0, 2, 1700000002.125),
    ("lm loss validation ppl", 3.0e38, 1 << 40, 1700000003.0),
    ("mem-allocated-bytes", 123456789.0, 7, 1.5),
    ("verlust \u00fc", float("nan"), 8, 1700000004.0),
    ("z_loss", float("inf"), 9, 1700000005.0),
]


def records(data):
    out, pos = [], 0
    while pos < len(data):
        (length,) = struct.unpack_from("<Q", data, pos)
        end = pos + 8 + 4 + length + 4
        out.append(data[pos:end])
        pos = end
    return out


def main():
    with tempfile.TemporaryDirectory() as d:
        w = SummaryWriter(log_dir=d)
        for tag, value, step, wall in SCALARS:
            w.add_scalar(tag, value, step, walltime=wall)
        w.close()
        (path,) = glob.glob(os.path.join(d, "events.out.tfevents.*"))
        data = open(path, "rb").read()
    recs = records(data)
    assert b"brain.Event:2" in recs[0] and len(recs) == 1 + len(SCALARS)
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "wb") as f:
        f.write(b"".join(recs[1:]))
    print(f"wrote {OUT}: {len(recs) - 1} records, {sum(map(len, recs[1:]))} bytes")
    print("first record's masked CRCs: length 0x%08x, payload 0x%08x" %
          (struct.unpack_from("<I", recs[1], 8)[0], struct.unpack_from("<I", recs[1], len(recs[1]) - 4)[0]))


if __name__ == "__main__":
    main()
