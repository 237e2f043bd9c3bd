#!/usr/bin/env python3
"""Weights & Biases offline runs, read with the wandb package's own record reader and protobufs.

Gale writes `--wandb-project` runs as wandb's offline run directory (src/core/wandb_writer.h,
docs/formats/wandb.md). This script, with `pip install wandb==0.19.11` (the last release whose
Python package still carries wandb/sdk/internal/datastore.py, the .wandb record reader/writer):

  framing OUT      writes fixed payloads with wandb's DataStore and describes the file it wrote
                   (every record header, the block-tail padding, the file's CRC-32) into OUT:
                   tests/data/reference/wandb/framing.txt, compared by tests/core/wandb_writer_test.cc
  decode RUN_FILE  prints the records of a .wandb file, parsed by wandb_internal_pb2.Record, with
                   times and host masked: tests/data/reference/wandb/fixed_run.txt is this output
                   for the run tests/core/wandb_writer_test.cc writes (GALE_WANDB_KEEP=DIR keeps it)
  check RUN_DIR LOG  checks an offline run written by `gale pretrain --wandb-project ...` against
                   that run's printed log: every record parses, the history rows' lm loss and
                   learning rate equal the log lines', the summary holds the last row's values,
                   the config names the project, the exit code is 0.
No network is used (nothing is synced).
"""
import glob
import json
import os
import re
import sys
import tempfile
import zlib

import wandb

wandb._assert_is_internal_process = True  # DataStore refuses to run outside wandb's internal process
from wandb.proto import wandb_internal_pb2 as pb  # noqa: E402
from wandb.sdk.internal import datastore  # noqa: E402

# The framing case: (payload sizes) chosen for the boundary cases from offset 7 (after the file
# header): a small record, one ending 3 bytes before a block end (zero padding), one spanning three
# blocks (FIRST, MIDDLE, LAST), an empty one, one ending exactly on a block boundary, one leaving
# exactly 7 bytes (a FIRST record with no data), then two small ones.
FRAMING_SIZES = [100, 32644, 70000, 0, 28269, 32754, 20, 5]


def payload(i, n):
    return bytes((i * 31 + j * 7) % 251 for j in range(n))


def framing(out):
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "framing.wandb")
        ds = datastore.DataStore()
        ds.open_for_write(path)
        for i, n in enumerate(FRAMING_SIZES):
            ds._write_data(payload(i, n))
        ds.close()
        data = open(path, "rb").read()
    lines = ["# wandb " + wandb.__version__ + " DataStore: payload i has bytes (i*31 + j*7) % 251",
             "sizes " + " ".join(str(n) for n in FRAMING_SIZES),
             "header " + data[:7].hex()]
    pos = 7
    while pos < len(data):
        left = datastore.LEVELDBLOG_BLOCK_LEN - pos % datastore.LEVELDBLOG_BLOCK_LEN
        if left < datastore.LEVELDBLOG_HEADER_LEN:
            assert data[pos:pos + left] == b"\0" * left
            lines.append(f"pad {pos} {left}")
            pos += left
            continue
        crc = int.from_bytes(data[pos:pos + 4], "little")
        length = int.from_bytes(data[pos + 4:pos + 6], "little")
        kind = data[pos + 6]
        lines.append(f"record {pos} type {kind} length {length} crc {crc:08x}")
        pos += 7 + length
    lines.append(f"size {len(data)} crc32 {zlib.crc32(data):08x}")
    open(out, "w").write("\n".join(lines) + "\n")


def records(path):
    ds = datastore.DataStore()
    ds.open_for_scan(path)
    out = []
    while True:
        data = ds.scan_data()
        if data is None:
            break
        r = pb.Record()
        r.ParseFromString(data)
        assert r.SerializeToString() == data, "a record does not re-serialize to its bytes"
        out.append(r)
    return out


MASKED = {"_runtime", "_timestamp"}


def items(xs):
    return " ".join(f"{x.key}={'<t>' if x.key in MASKED else x.value_json}" for x in xs)


def describe(r):
    kind = r.WhichOneof("record_type")
    if kind == "header":
        v = r.header.version_info
        return f"{r.num} header producer={v.producer} min_consumer={v.min_consumer}"
    if kind == "run":
        x = r.run
        return (f"{r.num} run run_id={x.run_id} project={x.project} display_name={x.display_name} host=<h> "
                f"start_time=<t> config: {items(x.config.update)}")
    if kind == "history":
        return f"{r.num} history step={r.history.step.num} items: {items(r.history.item)}"
    if kind == "summary":
        return f"{r.num} summary updates: {items(r.summary.update)}"
    if kind == "exit":
        return f"{r.num} exit exit_code={r.exit.exit_code} runtime=<t>"
    raise AssertionError(f"record {r.num}: unexpected {kind}")


def decode(path):
    for r in records(path):
        print(describe(r))


def check(run_dir, log_path):
    runs = glob.glob(os.path.join(run_dir, "run-*.wandb"))
    assert len(runs) == 1, runs
    rs = records(runs[0])
    kinds = [r.WhichOneof("record_type") for r in rs]
    assert kinds[:2] == ["header", "run"] and kinds[-1] == "exit", kinds
    assert [r.num for r in rs] == list(range(1, len(rs) + 1))
    assert rs[-1].exit.exit_code == 0
    config = {c.key: json.loads(c.value_json) for c in rs[1].run.config.update}
    print("config items:", len(config), "project:", config.get("wandb_project"))
    assert config["wandb_project"] == rs[1].run.project
    log = open(log_path).read()
    logged = {}
    for m in re.finditer(r"iteration +(\d+)/ *\d+ \|.*", log):
        line = m.group(0)
        it = int(m.group(1))
        loss = re.search(r"\| lm loss: ([0-9.E+-]+) \|", line)
        lr = re.search(r"\| learning rate: ([0-9.E+-]+) \|", line)
        logged[it] = (float(loss.group(1)), float(lr.group(1)))
    rows = {}
    summary = {}
    for r in rs:
        if r.HasField("history"):
            row = {h.key: json.loads(h.value_json) for h in r.history.item}
            assert row["_step"] == r.history.step.num
            rows[r.history.step.num] = row
        if r.HasField("summary"):
            summary.update({s.key: json.loads(s.value_json) for s in r.summary.update})
    n = 0
    for it, (loss, lr) in logged.items():
        if it not in rows or "lm loss" not in rows[it]:
            continue
        assert abs(rows[it]["lm loss"] - loss) <= 1e-6 * abs(loss), (it, rows[it]["lm loss"], loss)
        assert abs(rows[it]["learning-rate"] - lr) <= 1e-6 * abs(lr), (it, rows[it]["learning-rate"], lr)
        n += 1
    assert n > 0, "no history row matches a log line"
    last = rows[max(rows)]
    for k, v in last.items():
        assert summary[k] == v, (k, summary[k], v)
    print(f"ok: {len(rs)} records parse; {n} rows equal the log lines; summary = last values; exit 0")


if __name__ == "__main__":
    cmd = sys.argv[1]
    {"framing": lambda: framing(sys.argv[2]), "decode": lambda: decode(sys.argv[2]),
     "check": lambda: check(sys.argv[2], sys.argv[3])}[cmd]()
