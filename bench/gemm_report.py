#!/usr/bin/python3
# Turns gemm_bench JSON output into the markdown tables of docs/gemm.md (best repetition of each row).
#
#   build/bench/gemm_bench --benchmark_repetitions=3 --benchmark_out=gemm.json --benchmark_out_format=json
#   bench/gemm_report.py gemm.json [more.json ...]   # the best of each row over the files
#
# Standard library only.

import json
import sys

LAYERS = ["gpt.qkv", "llama.qkv", "proj", "gpt.fc1", "llama.fc1", "gpt.fc2", "llama.fc2", "output"]
DIRECTIONS = ["fwd", "bwd-data", "bwd-weight"]
ATTENTION = ["attn.qk", "attn.pv", "attn.tn"]
LAYERS_PER_MODEL = 12


def load(paths, keep_all=False):
    """{row name: best row} over the files, and the context of the file with the highest FMA peak.
    A file run without --wait-quiet whose FMA peak is below 85% of the highest was measured while
    other processes held the CPUs; it is left out, with a note on stderr. (With --wait-quiet each
    row waited for an idle machine, even if the peak measured at the start did not.)"""
    files = []
    for path in paths:
        try:
            with open(path) as f:
                data = json.load(f)
        except (OSError, ValueError) as e:
            print(f"gemm_report: leaving out {path}: {e} (a run still in progress?)", file=sys.stderr)
            continue
        files.append((path, data, float(data.get("context", {}).get("fma_peak_gflops", 0) or 0)))
    if not files:
        sys.exit("gemm_report: no readable gemm_bench JSON file")
    top = max(peak for _, _, peak in files)
    rows, context = {}, {}
    for path, data, peak in files:
        waited = float(data.get("context", {}).get("wait_quiet_seconds", 0) or 0) > 0
        if peak < 0.85 * top and not waited and not keep_all:
            print(f"gemm_report: leaving out {path}: FMA peak {peak:.0f} < 85% of {top:.0f} GFLOP/s (a busy machine)",
                  file=sys.stderr)
            continue
        ctx = data.get("context", {})
        if peak == top:
            context.update(ctx)
        else:
            context.update({k: v for k, v in ctx.items() if k.startswith("backend ")})
        for b in data["benchmarks"]:
            if b.get("run_type", "iteration") != "iteration" or b.get("error_occurred"):
                continue
            name = b.get("run_name", b["name"]).replace("/manual_time", "")
            ms = b["real_time"] * {"ns": 1e-6, "us": 1e-3, "ms": 1.0, "s": 1e3}[b.get("time_unit", "ns")]
            best = rows.get(name)
            if best is None or ms < best["ms"]:
                rows[name] = dict(b, ms=ms, gflops=b.get("GFLOP/s", 0.0))
    return rows, context


ORDER = ["onednn", "onednn-matmul-f32", "onednn-matmul-bf16", "openblas-pthread", "openblas-pthread-cooperlake",
         "openblas-pthread-prescott", "openblas-openmp", "blis-openmp", "blis-pthread"]


def backends_of(rows):
    """The backends that have rows, in gemm_bench's order (others after, alphabetically)."""
    seen = {name.split("/")[1] for name in rows if name.startswith("gemm/")}
    return [b for b in ORDER if b in seen] + sorted(seen - set(ORDER))


def best_row(rows, backend, shape):
    """The fastest row of `backend` for `shape` over the modes (call, heads-seq, heads-omp, batched)."""
    found = [r for n, r in rows.items() if n.startswith(f"gemm/{backend}/{shape}/")]
    return min(found, key=lambda r: r["ms"]) if found else None


def step_rows(rows, backend, model):
    """(row, times per step) for each GEMM of one training step of `model`, or None when a row is missing."""
    out = []
    for layer in LAYERS:
        if layer.split(".")[0] in ("gpt", "llama") and not layer.startswith(model + "."):
            continue
        for d in DIRECTIONS:
            r = rows.get(f"gemm/{backend}/{layer}/{d}/call")
            if r is None:
                return None
            out.append((r, 1 if layer == "output" else LAYERS_PER_MODEL))
    for a in ATTENTION:
        r = best_row(rows, backend, a)
        if r is None:
            return None
        out.append((r, 2 * LAYERS_PER_MODEL))
    return out


def step_ms(rows, backend, model):
    """Sum over one training step's GEMMs of count x best time, or None when a row is missing."""
    parts = step_rows(rows, backend, model)
    return None if parts is None else sum(r["ms"] * n for r, n in parts)


def main(paths, keep_all):
    rows, context = load(paths, keep_all)
    peak = float(context.get("fma_peak_gflops", "0") or 0)
    backends = backends_of(rows)
    print(f"FMA peak: {context.get('fma_peak', '?')}; host {context.get('host_name', '?')}, "
          f"{context.get('num_cpus', '?')} CPUs, {context.get('date', '?')}\n")
    for key in sorted(context):
        if key.startswith("backend "):
            print(f"- `{key[8:]}`: {context[key]}")
    print()

    print("GFLOP/s (best of the repetitions); % of the FMA peak in the last column for onednn\n")
    print("| GEMM | M×N×K | " + " | ".join(backends) + " | onednn % peak |")
    print("|---|---|" + "---|" * len(backends) + "---|")
    for layer in LAYERS + ATTENTION:
        for d in (DIRECTIONS if not layer.startswith("attn.") else [None]):
            shape = f"{layer}/{d}" if d else layer
            cells = []
            for b in backends:
                r = best_row(rows, b, shape)
                cells.append(f"{r['gflops']:.0f}" if r else "-")
            if all(c == "-" for c in cells):
                continue
            ref = best_row(rows, "onednn", shape)
            pct = f"{100 * ref['gflops'] / peak:.0f}%" if peak and ref else "-"
            print(f"| {shape} | {mnk_of(shape)} | " + " | ".join(cells) + f" | {pct} |")
    print()

    print("Attention, 48 heads: one multi-threaded GEMM per head in turn (seq) vs heads split over OpenMP threads "
          "(omp) vs one batched matmul primitive (batched), GFLOP/s\n")
    print("| backend | " + " | ".join(f"{a} seq | {a} omp" for a in ATTENTION) + " |")
    print("|---|" + "---|---|" * len(ATTENTION))
    for b in backends:
        cells = []
        for a in ATTENTION:
            for mode in ("heads-seq", "heads-omp"):
                r = rows.get(f"gemm/{b}/{a}/{mode}")
                if r is None and mode == "heads-seq":
                    r = rows.get(f"gemm/{b}/{a}/batched")
                cells.append(f"{r['gflops']:.0f}" if r else "-")
        print(f"| {b} | " + " | ".join(cells) + " |")
    print()

    print("GEMM time of one training step (sum over its GEMMs of count × best time; attention in its best mode)\n")
    print("| backend | gpt ms | gpt GFLOP/s | llama ms | llama GFLOP/s |")
    print("|---|---|---|---|---|")
    step_flops = {m: step_flops_of(rows, m) for m in ("gpt", "llama")}
    for b in backends:
        cells = []
        for m in ("gpt", "llama"):
            t = step_ms(rows, b, m)
            cells += [f"{t:.0f}", f"{step_flops[m] / (t * 1e-3) * 1e-9:.0f}"] if t and step_flops[m] else ["-", "-"]
        print(f"| {b} | " + " | ".join(cells) + " |")
    print()

    mix = {n: r for n, r in rows.items() if n.startswith("mix/")}
    if mix:
        print("fc1 forward GEMM + GELU on Gale's OpenMP threads, ms per pair\n")
        print("| backend | GEMM alone | GELU alone | alternating | slowdown |")
        print("|---|---|---|---|---|")
        for n, r in mix.items():
            print(f"| {n.split('/')[1]} | {r['gemm_ms']:.1f} | {r['gelu_ms']:.1f} | {r['mixed_ms']:.1f} | "
                  f"{r['slowdown']:.2f}x |")


SHAPES = {}


def mnk_of(shape):
    return SHAPES.get(shape, "")


def step_flops_of(rows, model):
    """FLOPs of one step's GEMMs, from the onednn rows (GFLOP/s × time of each row)."""
    parts = step_rows(rows, "onednn", model)
    return None if parts is None else sum(r["gflops"] * 1e9 * r["ms"] * 1e-3 * n for r, n in parts)


def fill_shapes():
    t, h = 1024, 768
    dims = {"gpt.qkv": (h, 2304), "llama.qkv": (h, 1280), "proj": (h, h), "gpt.fc1": (h, 3072),
            "llama.fc1": (h, 4096), "gpt.fc2": (3072, h), "llama.fc2": (2048, h), "output": (h, 50304)}
    for layer, (i, o) in dims.items():
        SHAPES[f"{layer}/fwd"] = f"{t}×{o}×{i}"
        SHAPES[f"{layer}/bwd-data"] = f"{t}×{i}×{o}"
        SHAPES[f"{layer}/bwd-weight"] = f"{o}×{i}×{t}"
    SHAPES["attn.qk"] = "48 × 256×256×64"
    SHAPES["attn.pv"] = "48 × 256×64×256"
    SHAPES["attn.tn"] = "48 × 256×64×256 (Aᵀ)"


if __name__ == "__main__":
    args = [a for a in sys.argv[1:] if a != "--keep-all"]
    if not args:
        sys.exit("usage: bench/gemm_report.py [--keep-all] gemm_bench.json [...]\n"
                 "  --keep-all: keep files from a busy machine too (see load())")
    fill_shapes()
    main(args, "--keep-all" in sys.argv[1:])
