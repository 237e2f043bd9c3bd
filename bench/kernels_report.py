#!/usr/bin/env python3
"""Runs the kernel benchmarks and prints the Markdown tables of docs/kernels.md.

Usage: bench/kernels_report.py [--build build] [--threads N] [--quick]
Standard library only. With --threads 1 the rates are computed from CPU time (robust when other
processes share the machine); otherwise from wall-clock time (the benchmarks use real time).
"""
import argparse
import json
import os
import subprocess
import sys

IMPL = {0: "reference", 1: "fused-scalar", 2: "fused-avx2", 3: "fused-avx512"}


def run(binary, filt, threads, extra=()):
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    cmd = [binary, "--benchmark_format=json", "--benchmark_filter=" + filt, *extra]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    return [b for b in json.loads(out)["benchmarks"] if b.get("run_type", "iteration") == "iteration"
            and not b.get("error_occurred")]


def seconds(b, use_cpu):
    t = b["cpu_time"] if use_cpu else b["real_time"]
    return t * {"ns": 1e-9, "us": 1e-6, "ms": 1e-3, "s": 1.0}[b["time_unit"]]


def rate(b, counter, use_cpu):
    """The benchmark's GB/s or GFLOP/s counter, recomputed from CPU time when asked."""
    value = b.get(counter)
    if value is None:
        return None
    if not use_cpu:
        return value
    return value * seconds(b, False) / seconds(b, True)


def kernels_table(build, threads, use_cpu):
    rows = {}
    for b in run(os.path.join(build, "bench/kernels_bench"), ".", threads):
        name = b["name"].split("/")[0].replace("BM_", "")
        args = [a for a in b["name"].split("/")[1:] if a != "real_time" and not a.startswith("iterations")]
        if name in ("MemoryCopy", "Sgemm"):
            counter = "GB/s" if "GB/s" in b else "GFLOP/s"
            print(f"- {name}: {rate(b, counter, use_cpu):.1f} {counter}")
            continue
        impl = int(args[0].split(":")[-1])
        variant = "/".join(args[1:])
        key = name + (f" ({variant})" if variant else "")
        counter = "GB/s" if "GB/s" in b else "GFLOP/s"
        rows.setdefault(key, {})[impl] = (seconds(b, use_cpu) * 1e3, rate(b, counter, use_cpu), counter)
    print()
    print("| kernel | reference ms | fused-avx512 ms | speed-up | fused-avx2 ms | fused-scalar ms | avx512 rate |")
    print("|---|---|---|---|---|---|---|")
    for key, r in rows.items():
        if 0 not in r or 3 not in r:
            continue
        ref, best = r[0][0], r[3][0]
        cell = lambda i: f"{r[i][0]:.2f}" if i in r else "-"
        print(f"| {key} | {ref:.2f} | {best:.2f} | {ref / best:.1f}× | {cell(2)} | {cell(1)} | {r[3][1]:.1f} {r[3][2]} |")


def gemm_table(build, threads, use_cpu):
    names = ["qkv", "proj", "fc1", "fc2", "lm_head"]
    passes = ["forward", "data grad", "weight grad"]
    res = {}
    label = {}
    for b in run(os.path.join(build, "bench/kernels_gemm_bench"), "BM_Gemm", threads):
        parts = dict(a.split(":") for a in b["name"].split("/")[1:] if ":" in a)
        key = (int(parts["shape"]), int(parts["pass"]))
        res.setdefault(key, {})[int(parts["bf16"])] = rate(b, "GFLOP/s", use_cpu)
        if int(parts["bf16"]):
            label[key] = b.get("label", "")
    print("| shape | pass | fp32 sgemm GFLOP/s | bf16 GFLOP/s | bf16 / fp32 | oneDNN bf16 kernel |")
    print("|---|---|---|---|---|---|")
    for (s, p), r in sorted(res.items()):
        print(f"| {names[s]} | {passes[p]} | {r[0]:.0f} | {r[1]:.0f} | {r[1] / r[0]:.2f} | {label[(s, p)]} |")
    for b in run(os.path.join(build, "bench/kernels_gemm_bench"), "Convert", threads):
        print(f"- {b['name'].split('/')[0].replace('BM_', '')}: {rate(b, 'GB/s', use_cpu):.1f} GB/s")


def attention_table(build, threads, use_cpu):
    print("| S | pass | impl | time ms | GFLOP/s | peak RSS growth MiB | allocator peak MiB |")
    print("|---|---|---|---|---|---|---|")
    for b in run(os.path.join(build, "bench/attention_bench"), ".", threads):
        parts = dict(a.split(":") for a in b["name"].split("/")[1:] if ":" in a)
        impl = IMPL[int(parts["impl"])]
        # The backward run times only the backward (its forward ran before the timer).
        pas = "backward" if parts["backward"] == "1" else "forward"
        print(f"| {parts['S']} | {pas} | {impl} | {seconds(b, use_cpu) * 1e3:.0f} | "
              f"{rate(b, 'GFLOP/s', use_cpu):.1f} | {b.get('peak_MiB', float('nan')):.1f} | {b['alloc_MiB']:.1f} |")


def step_table(build, threads, use_cpu):
    res = run(os.path.join(build, "bench/kernels_step_profile_bench"), ".", threads)
    prefix = "cpu_" if use_cpu else ""
    skip = ("real_time", "cpu_time", "iterations", "step", "tokens/s")
    cols = [k[len(prefix):] for k in res[0] if k not in skip and k.startswith(prefix)
            and isinstance(res[0][k], float) and (use_cpu or not k.startswith("cpu_"))
            and k[len(prefix):] not in skip]
    cols = sorted(cols, key=lambda k: -res[0][prefix + k])
    print("| ms per step | " + " | ".join(IMPL[int(b["name"].split(":")[1].split("/")[0])] for b in res) + " |")
    print("|---|" + "---|" * len(res))
    for k in ["step"] + cols:
        print(f"| {k} | " + " | ".join(f"{b[prefix + k]:.0f}" for b in res) + " |")
    print("| tokens/s | " + " | ".join(f"{4 * 256 / (b[prefix + 'step'] * 1e-3):.1f}" for b in res) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--build", default="build")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--only", choices=["kernels", "gemm", "attention", "step"])
    a = ap.parse_args()
    use_cpu = a.threads == 1
    with open("/proc/loadavg") as f:
        print(f"<!-- load average before: {f.read().split()[0]}, OMP_NUM_THREADS={a.threads}, "
              f"rates from {'CPU' if use_cpu else 'wall-clock'} time -->")
    for name, fn in (("kernels", kernels_table), ("gemm", gemm_table), ("attention", attention_table),
                     ("step", step_table)):
        if a.only in (None, name):
            print(f"\n### {name}\n")
            fn(a.build, a.threads, use_cpu)
            sys.stdout.flush()


if __name__ == "__main__":
    main()
