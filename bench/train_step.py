#!/usr/bin/python3
# End-to-end training throughput: Gale (`gale pretrain`) against plain PyTorch eager, same models, same threads.
#
# Runs with Debian's /usr/bin/python3 (python3-torch 1.13, python3-numpy; scripts/install-deps.sh
# --bench). Standard library only, except the PyTorch worker. Usage and figures: bench/README.md.
#
#   bench/train_step.py                         # both models, PyTorch and Gale, 2 warm-up + 5 timed steps
#   bench/train_step.py --configs gpt --skip-torch --gale build/bin/gale --levels 0,1,2
#   bench/train_step.py --self-test             # checks the harness itself against a fake `gale`
#
# For each model it prints tokens/s, achieved model GFLOP/s (Megatron's FLOPs formula,
# megatron.md §5), MFU against the FMA peak measured by bench/fma_peak_bench, the onednn sgemm
# rate of the model's fc1 GEMM measured by bench/gemm_bench in the same run, and peak RSS of each
# training process (wait4's ru_maxrss, so each process is measured alone).

import argparse
import importlib.util
import json
import math
import os
import re
import shlex
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)

# ---------------------------------------------------------------------------------------------
# Models


class ModelConfig:
    """The benchmark models (docs/model.md), named as Megatron's flags."""

    def __init__(self, name, title, llama):
        self.name = name
        self.title = title
        self.llama = llama
        self.num_layers = 12
        self.hidden_size = 768
        self.num_attention_heads = 12
        self.seq_length = 256
        self.micro_batch_size = 4
        self.global_batch_size = 4
        self.vocab_size = 50303  # NullTokenizer: vocab_size + 1 = 50304 entries
        self.dropout = 0.0  # attention and hidden dropout (--dropout; Megatron's default is 0.1)
        self.make_vocab_size_divisible_by = 128
        self.num_query_groups = 4 if llama else 12
        self.kv_channels = self.hidden_size // self.num_attention_heads
        self.swiglu = llama
        # Megatron's default FFN size: 4h, or int(4h·2/3 / 64)·64 with SwiGLU.
        self.ffn_hidden_size = int(4 * self.hidden_size * 2 / 3 / 64) * 64 if llama else 4 * self.hidden_size

    @property
    def padded_vocab_size(self):
        n = self.vocab_size + 1
        m = self.make_vocab_size_divisible_by
        return (n + m - 1) // m * m

    @property
    def tokens_per_iteration(self):
        return self.global_batch_size * self.seq_length

    def gale_flags(self, train_iters, threads):
        f = ["--num-layers", self.num_layers, "--hidden-size", self.hidden_size,
             "--num-attention-heads", self.num_attention_heads, "--seq-length", self.seq_length,
             "--max-position-embeddings", self.seq_length, "--micro-batch-size", self.micro_batch_size,
             "--global-batch-size", self.global_batch_size, "--mock-data", "--vocab-size", self.vocab_size,
             "--train-iters", train_iters, "--lr", "1e-4", "--min-lr", "1e-5", "--weight-decay", "0.01",
             "--clip-grad", "1.0", "--attention-dropout", self.dropout, "--hidden-dropout", self.dropout,
             "--log-interval", 1,
             "--log-throughput", "--eval-iters", 0, "--num-threads", threads]
        if self.llama:
            f += ["--normalization", "RMSNorm", "--swiglu", "--position-embedding-type", "rope",
                  "--group-query-attention", "--num-query-groups", self.num_query_groups,
                  "--disable-bias-linear", "--untie-embeddings-and-output-weights"]
        return [str(x) for x in f]

    def level2_feature_flags(self):
        """Level 2 features are each gated by their own flag too (as MindSpeed): what a user turns on."""
        f = ["--use-flash-attn", "--cross-entropy-loss-fusion"]
        if self.llama:
            f += ["--use-fused-rmsnorm", "--use-fused-swiglu", "--use-fused-rotary-pos-emb"]
        return f


CONFIGS = {
    "gpt": ModelConfig("gpt", "GPT-2-small: 12 layers, hidden 768, 12 heads, seq 256, micro-batch 4, vocab 50304",
                       llama=False),
    "llama": ModelConfig("llama", "LLaMA-style: as gpt with RMSNorm, SwiGLU ffn 2048, RoPE, 4 query groups, "
                         "no biases, untied output", llama=True),
}


def megatron_flops_per_iteration(c, batch_size=None):
    """num_floating_point_operations of Megatron's training.py for a dense GPT (megatron.md §5):
    B·s·[12·L·h·F_mlp + 12·L·h²·(1 + g/n + s/(2h))·(kv·n/h) + 6·h·V], F_mlp = ffn·(1.5 with SwiGLU)."""
    B = c.global_batch_size if batch_size is None else batch_size
    s, L, h, n = c.seq_length, c.num_layers, c.hidden_size, c.num_attention_heads
    g, kv, V = c.num_query_groups, c.kv_channels, c.padded_vocab_size
    f_mlp = (1.5 if c.swiglu else 1.0) * c.ffn_hidden_size
    attention = 12 * L * h * h * (1 + g / n + s / (2 * h)) * (kv * n / h)
    return B * s * (12 * L * h * f_mlp + attention + 6 * h * V)


# ---------------------------------------------------------------------------------------------
# Megatron's training log line (megatron.md §5)

LOG_LINE = re.compile(r"^ \[[^\]]*\] iteration\s+(\d+)/\s*(\d+) \|(.*)$")


def parse_log_line(line):
    """The fields of one Megatron training log line as a dict, or None for any other line."""
    m = LOG_LINE.match(line.rstrip("\n"))
    if not m:
        return None
    out = {"iteration": int(m.group(1)), "train_iters": int(m.group(2))}
    for field in m.group(3).split("|"):
        if ":" not in field:
            continue
        key, value = field.split(":", 1)
        key, value = key.strip(), value.strip()
        try:
            out[key] = float(value)
        except ValueError:
            out[key] = value
    return out


def summarize_iterations(records, warmup, tokens_per_iteration):
    """Mean over the iterations after `warmup` of the per-iteration time; None when none are left."""
    timed = [r for r in records if r["iteration"] > warmup and "elapsed time per iteration (ms)" in r]
    if not timed:
        return None
    ms = sum(r["elapsed time per iteration (ms)"] for r in timed) / len(timed)
    tflops = [r["throughput per GPU (TFLOP/s/GPU)"] for r in timed if "throughput per GPU (TFLOP/s/GPU)" in r]
    losses = [r["lm loss"] for r in records if "lm loss" in r]
    return {
        "iterations": len(timed),
        "ms": ms,
        "tokens_per_s": tokens_per_iteration / (ms / 1000.0),
        "printed_tflops": sum(tflops) / len(tflops) if tflops else None,
        "first_loss": losses[0] if losses else None,
        "last_loss": losses[-1] if losses else None,
    }


# ---------------------------------------------------------------------------------------------
# Processes


def cpu_ticks():
    """(all CPU time, idle time) in clock ticks since boot, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return sum(v), v[3] + v[4]


def wait_until_quiet(max_seconds):
    """Waits up to max_seconds until other processes leave the CPUs idle (< 10% busy over 1 s)."""
    deadline = time.monotonic() + max_seconds
    while time.monotonic() < deadline:
        t0, i0 = cpu_ticks()
        time.sleep(1.0)
        t1, i1 = cpu_ticks()
        if t1 > t0 and 100 * ((t1 - t0) - (i1 - i0)) / (t1 - t0) < 10:
            return True
    return False


class Measured:
    """Exit code, output, peak RSS (bytes) of one process, and how busy other processes kept the CPUs."""

    def __init__(self, rc, out, err, rss, others_percent):
        self.rc, self.out, self.err, self.rss, self.others_percent = rc, out, err, rss, others_percent


def run_measured(cmd, env=None, timeout=None):
    """Runs cmd alone in a process; peak RSS is that process's own (wait4), and others_percent is
    the CPU time other processes used meanwhile, in percent of all CPUs (a busy machine skews times)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        ticks0, idle0 = cpu_ticks()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env)
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            pid, status, usage = os.wait4(proc.pid, os.WNOHANG)
            if pid:
                break
            if deadline is not None and time.monotonic() > deadline:
                proc.kill()
                pid, status, usage = os.wait4(proc.pid, 0)
                break
            time.sleep(0.05)
        ticks1, idle1 = cpu_ticks()
        proc.returncode = os.waitstatus_to_exitcode(status)
        hz = os.sysconf("SC_CLK_TCK")
        ours = (usage.ru_utime + usage.ru_stime) * hz
        total = max(1, ticks1 - ticks0)
        others = max(0.0, 100.0 * ((ticks1 - ticks0) - (idle1 - idle0) - ours) / total)
        out.seek(0)
        err.seek(0)
        return Measured(proc.returncode, out.read().decode(errors="replace"), err.read().decode(errors="replace"),
                        usage.ru_maxrss * 1024, others)


def rejected_flag(stderr_text, flag):
    """True when the program refused `flag` (unknown, or not supported yet)."""
    for line in stderr_text.splitlines():
        if flag in line and re.search(r"not supported|unknown|unrecognized|not a valid|invalid|expected", line, re.I):
            return True
    return False


def run_gale(gale, c, level, warmup, iters, threads, timeout, extra=()):
    cmd = [gale, "pretrain"] + c.gale_flags(warmup + iters, threads)
    if level is not None:
        cmd += ["--optimization-level", str(level)]
    if level == 2:
        cmd += c.level2_feature_flags()
    cmd += list(extra)
    env = dict(os.environ, OMP_NUM_THREADS=str(threads))
    m = run_measured(cmd, env=env, timeout=timeout)
    rc, out, err = m.rc, m.out, m.err
    name = "gale" if level is None else f"gale -O{level}"
    if extra:
        name += " " + " ".join(extra)
    result = {"name": name, "command": " ".join(shlex.quote(x) for x in cmd),
              "rss": m.rss, "rc": rc, "others_percent": m.others_percent}
    if rc != 0:
        if level is not None and rejected_flag(err, "--optimization-level"):
            result["skipped"] = f"--optimization-level {level} rejected: {err.strip().splitlines()[-1]}"
        else:
            tail = (err.strip() or out.strip()).splitlines()[-3:]
            result["error"] = f"exit code {rc}: " + " / ".join(tail)
        return result
    records = [r for r in (parse_log_line(l) for l in out.splitlines()) if r]
    summary = summarize_iterations(records, warmup, c.tokens_per_iteration)
    if summary is None:
        result["error"] = f"no training log line after iteration {warmup} in its output"
        return result
    result.update(summary)
    result["banner"] = [l for l in out.splitlines() if l.startswith("GEMM")][:2]
    return result


def run_bench_json(path, args):
    """Runs a Google Benchmark program with JSON output; returns (parsed JSON, stderr) or raises."""
    m = run_measured([path, "--benchmark_format=json"] + args)
    if m.rc != 0 or not m.out.strip():
        raise RuntimeError(f"{path} {' '.join(args)} failed (exit code {m.rc}): {m.err.strip()[-300:]}")
    return json.loads(m.out), m.err


def measure_fma_peak(bench_dir, threads, wait_quiet=0):
    path = os.path.join(bench_dir, "fma_peak_bench")
    if wait_quiet:
        wait_until_quiet(wait_quiet)
    data, _ = run_bench_json(path, [f"--benchmark_filter=/threads:{threads}(/|$)", "--benchmark_repetitions=3"])
    best = {}
    for b in data["benchmarks"]:
        if "GFLOP/s" in b and not b.get("error_occurred") and b.get("run_type", "iteration") == "iteration":
            isa = b["name"].split("/")[1]
            best[isa] = max(best.get(isa, 0.0), b["GFLOP/s"])
    if not best:
        raise RuntimeError(f"{path} reported no GFLOP/s for {threads} threads")
    isa = "avx512" if "avx512" in best else max(best, key=best.get)
    return best[isa], isa


def parse_step_summary(text, backend):
    """{model: {"ms", "gflops"}} from the summary gemm_bench prints last on stderr:
    "  onednn                           2594 (  304)     4710 (  155)", "-" for a model not measured."""
    step = {}
    in_summary = False
    for line in text.splitlines():
        if line.startswith("GEMM time of one training step"):
            in_summary = True
        cell = r"(\S+ \(\s*\S+\)|-)"
        m = re.match(rf"^\s+{re.escape(backend)}\s+{cell}\s+{cell}\s*$", line) if in_summary else None
        if m:
            for name, value in zip(["gpt", "llama"], m.groups()):
                v = re.match(r"(\S+) \(\s*(\S+)\)", value)
                if v:
                    step[name] = {"ms": float(v.group(1)), "gflops": float(v.group(2))}
    return step


def onednn_rates(bench_dir, threads, row_filter, repetitions, wait_quiet=0):
    """gemm_bench's onednn rows matching `row_filter` (after "^gemm/onednn/"): {row name: best GFLOP/s
    over the repetitions}, and gemm_bench's stderr (its closing step summary)."""
    path = os.path.join(bench_dir, "gemm_bench")
    data, err = run_bench_json(path, [f"--threads={threads}", "--backends=onednn", "--openblas-coretypes=",
                                      f"--wait-quiet={wait_quiet}", f"--benchmark_repetitions={repetitions}",
                                      "--benchmark_min_time=0.1", f"--benchmark_filter=^gemm/onednn/{row_filter}"])
    rates = {}
    for b in data["benchmarks"]:
        if b.get("run_type", "iteration") == "iteration":
            name = b["name"].replace("/manual_time", "")
            rates[name] = max(rates.get(name) or 0.0, b.get("GFLOP/s") or 0.0)
    return rates, err


def measure_sgemm(bench_dir, threads, configs, wait_quiet=0):
    """onednn sgemm GFLOP/s of each model's fc1 forward GEMM, and the GEMM time of a whole step."""
    names = "|".join(re.escape(f"{c}.") for c in configs)
    rates, err = onednn_rates(bench_dir, threads, f"(({names})|proj/|output/|attn\\.)", 2, wait_quiet)
    step = parse_step_summary(err, "onednn")
    return {c: rates.get(f"gemm/onednn/{c}.fc1/fwd/call") for c in configs}, step


def measure_step_sgemm(bench_dir, threads, config):
    """oneDNN's sgemm rate over all the GEMMs of one training step of `config` (every shape at its
    measured rate: gemm_bench's step summary), GFLOP/s, or None."""
    _, step = measure_sgemm(bench_dir, threads, [config])
    s = step.get(config)
    return s["gflops"] if s else None


def percent_of(gflops, rate):
    """"  82.5%" (7 characters) for gflops / rate, or "      -" without a rate."""
    return f"{100 * gflops / rate:6.1f}%" if rate else "      -"


def measure_fc1_sgemm(bench_dir, threads, config):
    """A quick probe of the same fc1 sgemm rate (best of 3 short repetitions), for one run's neighbourhood."""
    rates, _ = onednn_rates(bench_dir, threads, f"{re.escape(config)}\\.fc1/fwd/call", 3)
    return max(rates.values()) if rates else None


# ---------------------------------------------------------------------------------------------
# PyTorch side (a subprocess: `train_step.py --worker torch --model NAME`)


def torch_env(threads, preset):
    """Environment for the PyTorch process; returns (env, description of what was set)."""
    env = dict(os.environ)
    notes = []
    for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
        env[k] = str(threads)
    notes.append(f"OMP_NUM_THREADS=OPENBLAS_NUM_THREADS={threads}")
    flags = cpu_flags()
    if preset in ("tuned", "openblas-openmp"):
        # Debian's OpenBLAS picks its kernels from the CPU model number and falls back to Prescott
        # on models it does not know; name the core from the feature flags instead.
        core = ("Cooperlake" if "avx512_bf16" in flags else "SkylakeX") if "avx512f" in flags else \
            ("Haswell" if "avx2" in flags else None)
        if core:
            env["OPENBLAS_CORETYPE"] = core
            notes.append(f"OPENBLAS_CORETYPE={core}")
    if preset == "tuned":
        # One thread pool: OpenBLAS built on OpenMP shares libgomp with torch's intra-op threads.
        d = "/usr/lib/x86_64-linux-gnu/openblas-openmp"
        if os.path.exists(os.path.join(d, "libblas.so.3")):
            env["LD_LIBRARY_PATH"] = d + (":" + env["LD_LIBRARY_PATH"] if env.get("LD_LIBRARY_PATH") else "")
            notes.append(f"LD_LIBRARY_PATH={d}")
        else:
            env["OMP_WAIT_POLICY"] = "PASSIVE"
            notes.append("OMP_WAIT_POLICY=PASSIVE (libopenblas0-openmp not installed)")
    elif preset == "passive":
        env["OMP_WAIT_POLICY"] = "PASSIVE"
        notes.append("OMP_WAIT_POLICY=PASSIVE")
    elif preset != "system":
        raise ValueError(f"--torch-env: expected tuned, passive or system, found '{preset}'")
    return env, ", ".join(notes)


def cpu_flags():
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("flags"):
                    return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


def run_torch(c, warmup, iters, threads, preset, timeout, attention="auto", python=None, name="pytorch eager"):
    """One PyTorch training process; `python` is the interpreter whose torch runs (default: this one)."""
    env, notes = torch_env(threads, preset)
    cmd = [python or sys.executable, os.path.abspath(__file__), "--worker", "torch", "--model", c.name, "--warmup", str(warmup),
           "--iters", str(iters), "--threads", str(threads), "--dropout", str(c.dropout),
           "--torch-attention", attention]
    m = run_measured(cmd, env=env, timeout=timeout)
    rc, out, err = m.rc, m.out, m.err
    result = {"name": name, "rss": m.rss, "rc": rc, "env": notes, "others_percent": m.others_percent}
    if rc != 0:
        result["error"] = f"exit code {rc}: " + " / ".join(err.strip().splitlines()[-3:])
        return result
    report = json.loads(out.strip().splitlines()[-1])
    ms = sum(report["times_ms"][warmup:]) / iters
    result.update({"iterations": iters, "ms": ms, "tokens_per_s": c.tokens_per_iteration / (ms / 1000.0),
                   "printed_tflops": None, "first_loss": report["losses"][0], "last_loss": report["losses"][-1],
                   "runtime": report["runtime"]})
    return result


def torch_worker(args):
    """Trains the model with plain PyTorch eager ops and prints one JSON line of timings."""
    import ctypes
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    c = CONFIGS[args.model]
    c.dropout = args.dropout
    P = c.dropout  # Megatron's places: embeddings, attention probabilities, after proj and after fc2
    torch.set_num_threads(args.threads)
    torch.manual_seed(1234)
    H, NH, KV, HD, L = c.hidden_size, c.num_attention_heads, c.num_query_groups, c.kv_channels, c.num_layers
    V, S, B, Fh = c.padded_vocab_size, c.seq_length, c.micro_batch_size, c.ffn_hidden_size
    std = 0.02
    # torch >= 2.0 has a fused causal attention (flash kernel on CPU); use it unless told not to.
    has_sdpa = hasattr(F, "scaled_dot_product_attention")
    if args.torch_attention == "sdpa" and not has_sdpa:
        raise ValueError(f"--torch-attention sdpa: torch {torch.__version__} has no scaled_dot_product_attention")
    use_sdpa = has_sdpa and args.torch_attention != "explicit"

    class RMSNorm(nn.Module):
        def __init__(self, n, eps=1e-5):
            super().__init__()
            self.weight = nn.Parameter(torch.ones(n))
            self.eps = eps

        def forward(self, x):
            return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight

    def norm():
        return RMSNorm(H) if c.llama else nn.LayerNorm(H, eps=1e-5)

    def linear(i, o, init_std):
        lin = nn.Linear(i, o, bias=not c.llama)
        nn.init.normal_(lin.weight, 0.0, init_std)
        if lin.bias is not None:
            nn.init.zeros_(lin.bias)
        return lin

    def rope_tables():
        inv_freq = 10000.0 ** (-torch.arange(0, HD, 2, dtype=torch.float32) / HD)
        theta = torch.outer(torch.arange(S, dtype=torch.float32), inv_freq)
        emb = torch.cat([theta, theta], dim=-1)  # [S, HD]
        return emb.cos()[None, :, None, :], emb.sin()[None, :, None, :]

    def rotate_half(x):
        x1, x2 = x[..., : HD // 2], x[..., HD // 2:]
        return torch.cat([-x2, x1], dim=-1)

    class Layer(nn.Module):
        def __init__(self):
            super().__init__()
            self.input_norm = norm()
            self.qkv = linear(H, (NH + 2 * KV) * HD, std)
            self.proj = linear(NH * HD, H, std / math.sqrt(2 * L))
            self.mlp_norm = norm()
            self.fc1 = linear(H, 2 * Fh if c.swiglu else Fh, std)
            self.fc2 = linear(Fh, H, std / math.sqrt(2 * L))

        def forward(self, x, mask, rope):
            a = self.input_norm(x)
            # Megatron's grouped QKV layout: per group, NH/KV query heads, then its key and value head.
            qkv = self.qkv(a).view(B, S, KV, NH // KV + 2, HD)
            q = qkv[:, :, :, : NH // KV].reshape(B, S, NH, HD)
            k = qkv[:, :, :, NH // KV]
            v = qkv[:, :, :, NH // KV + 1]
            if rope is not None:
                cos, sin = rope
                q = q * cos + rotate_half(q) * sin
                k = k * cos + rotate_half(k) * sin
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)  # [B, heads, S, HD]
            if KV != NH:
                k = k.repeat_interleave(NH // KV, dim=1)
                v = v.repeat_interleave(NH // KV, dim=1)
            if use_sdpa:
                ctx = F.scaled_dot_product_attention(q, k, v, dropout_p=P, is_causal=True)
            else:
                scores = torch.matmul(q, k.transpose(-1, -2)) / math.sqrt(HD)
                probs = F.dropout(torch.softmax(scores.masked_fill(mask, float("-inf")), dim=-1), P)
                ctx = torch.matmul(probs, v)
            ctx = ctx.transpose(1, 2).reshape(B, S, NH * HD)
            x = x + F.dropout(self.proj(ctx), P)
            u = self.fc1(self.mlp_norm(x))
            g = F.silu(u[..., :Fh]) * u[..., Fh:] if c.swiglu else F.gelu(u)
            return x + F.dropout(self.fc2(g), P)

    class Model(nn.Module):
        def __init__(self):
            super().__init__()
            self.word_embeddings = nn.Parameter(torch.randn(V, H) * std)
            self.position_embeddings = None if c.llama else nn.Parameter(torch.randn(S, H) * std)
            self.layers = nn.ModuleList([Layer() for _ in range(L)])
            self.final_norm = norm()
            self.output_layer = nn.Parameter(torch.randn(V, H) * std) if c.llama else None

        def forward(self, tokens, labels, mask, rope):
            x = self.word_embeddings[tokens]
            if self.position_embeddings is not None:
                x = x + self.position_embeddings[None, :S]
            x = F.dropout(x, P)
            for layer in self.layers:
                x = layer(x, mask, rope)
            w_out = self.output_layer if self.output_layer is not None else self.word_embeddings
            logits = torch.matmul(self.final_norm(x), w_out.t())
            return F.cross_entropy(logits.view(-1, V), labels.view(-1))

    model = Model()
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.01}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=1e-4, betas=(0.9, 0.999), eps=1e-8)
    mask = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    rope = rope_tables() if c.llama else None
    gen = torch.Generator().manual_seed(0)
    times, losses = [], []
    for _ in range(args.warmup + args.iters):
        data = torch.randint(0, c.vocab_size, (B, S + 1), generator=gen)
        tokens, labels = data[:, :-1].contiguous(), data[:, 1:].contiguous()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=True)
        loss = model(tokens, labels, mask, rope)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        times.append((time.perf_counter() - t0) * 1000.0)
        losses.append(loss.item())

    runtime = {"torch": torch.__version__, "intra_op_threads": torch.get_num_threads(), "blas": [],
               "attention": "scaled_dot_product_attention" if use_sdpa else "explicit softmax"}
    with open("/proc/self/maps") as f:
        libs = sorted({line.split()[-1] for line in f if re.search(r"/lib(blas|openblas|blis|mkl|gomp|iomp)", line)})
    for lib in libs:
        entry = os.path.realpath(lib)
        if "openblas" in os.path.basename(lib):
            try:
                ob = ctypes.CDLL(lib)
                ob.openblas_get_corename.restype = ctypes.c_char_p
                par = {0: "sequential", 1: "pthreads", 2: "OpenMP"}.get(ob.openblas_get_parallel(), "?")
                core = ob.openblas_get_corename().decode()
                entry += f" (core {core}, {par}, {ob.openblas_get_num_threads()} threads)"
            except (OSError, AttributeError):
                pass
        runtime["blas"].append(entry)
    print(json.dumps({"times_ms": times, "losses": losses, "runtime": runtime}))


# ---------------------------------------------------------------------------------------------
# Report


def fmt_bytes(n):
    return f"{n / 2**30:.2f} GiB" if n else "-"


def print_report(c, results, peak, peak_isa, sgemm_rate, step_gemm, threads):
    flops = megatron_flops_per_iteration(c)
    print(f"\n== {c.name}: {c.title}, dropout {c.dropout:g}")
    print(f"   Megatron FLOPs per iteration: {flops:.4e} ({flops / c.tokens_per_iteration:.4e} per token); "
          f"{threads} threads; FMA peak {peak:.1f} GFLOP/s ({peak_isa})")
    if sgemm_rate:
        print(f"   onednn sgemm, fc1 forward ({c.name}): {sgemm_rate:.1f} GFLOP/s = "
              f"{100 * sgemm_rate / peak:.1f}% of peak")
    if step_gemm:
        print(f"   all GEMMs of one step at onednn's measured rates: {step_gemm['ms']:.0f} ms "
              f"({step_gemm['gflops']:.0f} GFLOP/s over the GEMMs alone)")
    head = f"   {'implementation':<20} {'tokens/s':>9} {'ms/iter':>9} {'GFLOP/s':>8} {'MFU':>6} {'sgemm':>6} {'/sgemm':>7} " \
           f"{'step':>5} {'/step':>7} " \
           f"{'peak RSS':>10} {'TFLOP/s printed/ours':>21} {'loss first->last':>20} {'busy':>5}"
    print(head)
    for r in results:
        if "error" in r or "skipped" in r:
            print(f"   {r['name']:<20} {r.get('error') or r.get('skipped')}")
            continue
        gflops = flops / (r["ms"] / 1000.0) * 1e-9
        mfu = 100 * gflops / peak
        rate = r.get("sgemm_fc1_gflops") or sgemm_rate  # the probes around this run, else the global rate
        vs_sgemm = percent_of(gflops, rate)
        probe = f"{rate:6.0f}" if rate else "     -"
        step_rate = r.get("step_sgemm_gflops") or (step_gemm or {}).get("gflops")
        step = f"{step_rate:5.0f}" if step_rate else "    -"
        ours_tflops = gflops / 1000.0
        printed = r.get("printed_tflops")
        check = f"{printed:.1f} / {ours_tflops:.3f}" if printed is not None else f"- / {ours_tflops:.3f}"
        if printed is not None and abs(printed - ours_tflops) > 0.05 + 0.02 * ours_tflops:
            check += " MISMATCH"
        loss = f"{r['first_loss']:.3f} -> {r['last_loss']:.3f}" if r.get("first_loss") is not None else "-"
        busy = f"{r['others_percent']:4.0f}%" if r.get("others_percent") is not None else "    -"
        print(f"   {r['name']:<20} {r['tokens_per_s']:9.1f} {r['ms']:9.1f} {gflops:8.1f} {mfu:5.1f}% {probe} {vs_sgemm} "
              f"{step} {percent_of(gflops, step_rate)} "
              f"{fmt_bytes(r['rss']):>10} {check:>21} {loss:>20} {busy}")
    print("   (busy: CPU time other processes used during the run, % of all CPUs; above a few % the times are "
          "pessimistic; sgemm: the faster fc1 sgemm probe just before / after that run, GFLOP/s, which /sgemm uses; "
          "step: the faster of onednn's rates over all the step's GEMM shapes, probed just before / after that run, "
          "which /step uses)")
    for r in results:
        if r.get("env"):
            print(f"   pytorch env: {r['env']}")
        if r.get("runtime"):
            rt = r["runtime"]
            print(f"   pytorch runtime: torch {rt['torch']}, {rt['intra_op_threads']} intra-op threads, "
                  f"attention: {rt.get('attention', 'explicit softmax')}, libraries: {'; '.join(rt['blas'])}")
        for line in r.get("banner", []):
            print(f"   {r['name']}: {line}")


# ---------------------------------------------------------------------------------------------
# Self-test (run by ctest: tests/bench/CMakeLists.txt)


def self_test():
    failures = []

    def expect(cond, what):
        if not cond:
            failures.append(what)

    # The FLOPs formula against Megatron's own nested form, written out independently:
    # 12·B·s·L·h²·[(1 + g/n + s/(2h))·(kv·n/h) + (ffn/h)·gl + V/(2·L·h)].
    for c in CONFIGS.values():
        B, s, L, h, n = c.global_batch_size, c.seq_length, c.num_layers, c.hidden_size, c.num_attention_heads
        nested = 12 * B * s * L * h * h * ((1 + c.num_query_groups / n + s / h / 2) * (c.kv_channels * n / h) +
                                           (c.ffn_hidden_size / h) * (1.5 if c.swiglu else 1) +
                                           c.padded_vocab_size / (2 * L * h))
        expect(abs(megatron_flops_per_iteration(c) - nested) < 1e-6 * nested, f"{c.name}: formula != nested form")
    # GPT-2-small by hand: per token 12·12·768·3072 + 12·12·768²·(2 + 1/6) + 6·768·50304
    # = 339738624 + 184025088 + 231800832 = 755564544; times 1024 tokens.
    expect(megatron_flops_per_iteration(CONFIGS["gpt"]) == 755564544 * 1024, "gpt FLOPs != hand-computed value")
    expect(CONFIGS["gpt"].padded_vocab_size == 50304, "padded vocab of 50303 + 1 must be 50304")
    expect(CONFIGS["llama"].ffn_hidden_size == 2048, "SwiGLU ffn of hidden 768 must be 2048")

    # The log-line parser on Megatron's own example line (megatron.md §5).
    example = (" [2025-05-20 15:48:49] iteration        1/      50 | consumed samples:           32 | elapsed time per "
               "iteration (ms): 4256.1 | throughput per GPU (TFLOP/s/GPU): 123.5 | learning rate: 3.000000E-05 | "
               "global batch size:    32 | lm loss: 1.083373E+01 | loss scale: 1.0 | grad norm: 5.679 | number of "
               "skipped iterations:   0 | number of nan iterations:   0 |")
    r = parse_log_line(example)
    expect(r is not None and r["iteration"] == 1 and r["train_iters"] == 50, "example line: iteration")
    expect(r is not None and r["elapsed time per iteration (ms)"] == 4256.1, "example line: elapsed time")
    expect(r is not None and r["throughput per GPU (TFLOP/s/GPU)"] == 123.5, "example line: throughput")
    expect(r is not None and r["lm loss"] == 10.83373, "example line: loss")
    expect(parse_log_line("GEMM: oneDNN 2.6.3 sgemm") is None, "a non-log line must not parse")
    expect(parse_log_line(" validation loss at iteration 10 | lm loss value: 1.0 |") is None, "validation line")

    # The Gale side against a fake `gale`: known times, a rejected --optimization-level, a crash.
    fake = os.path.join(HERE, "testdata", "fake_gale.sh")
    c = CONFIGS["gpt"]
    g = run_gale(fake, c, None, warmup=2, iters=3, threads=2, timeout=60)
    expect("error" not in g, f"fake gale run failed: {g.get('error')}")
    if "error" not in g:
        # The fake prints 9000, 5000, 4000, 4000, 4400 ms: the mean of the last three is 4133.33 ms.
        expect(g["iterations"] == 3, f"timed iterations {g['iterations']} != 3")
        expect(abs(g["ms"] - 4133.3333) < 1e-3, f"mean ms {g['ms']} != 4133.333")
        expect(abs(g["tokens_per_s"] - 1024 / 4.1333333) < 1e-3, f"tokens/s {g['tokens_per_s']}")
        expect(abs(g["printed_tflops"] - 0.2) < 1e-12, f"printed TFLOP/s {g['printed_tflops']}")
        expect(g["first_loss"] == 10.5 and g["last_loss"] == 7.25, "losses")
        expect(g["rss"] > 1024 * 1024, f"peak RSS {g['rss']} of the fake is implausible")
        expect("--swiglu" not in g["command"] and "--mock-data" in g["command"], "gpt flags")
        expect(0.0 <= g["others_percent"] <= 100.0, f"others' CPU share {g['others_percent']} out of range")
    g2 = run_gale(fake, c, 2, warmup=2, iters=3, threads=2, timeout=60)
    expect("skipped" in g2 and "rejected" in g2["skipped"], f"level 2 should be skipped as rejected: {g2}")
    g1 = run_gale(fake, CONFIGS["llama"], 1, warmup=2, iters=3, threads=2, timeout=60)
    expect("error" in g1 and "exit code 3" in g1["error"], f"a crash must be reported with its code: {g1}")
    g3 = run_gale(fake, c, None, warmup=9, iters=1, threads=2, timeout=60)  # fake stops at iteration 5
    expect("error" in g3 and "no training log line" in g3["error"], f"too few iterations must be an error: {g3}")

    # gemm_bench's closing summary (the backend list before it has "onednn" lines too).
    summary = ("  onednn                       oneDNN 2.6.3 sgemm (kernel ISA avx512_core_amx, 2 threads)\n"
               "\nGEMM time of one training step (1024 tokens; sum over its GEMMs of FLOPs / measured rate):\n"
               "  backend                         gpt ms (GF/s)  llama ms (GF/s)\n"
               "  onednn                           2594 (  304)                -\n"
               "  onednn-matmul-f32                4200 (  188)     2542 (  287)\n")
    expect(parse_step_summary(summary, "onednn") == {"gpt": {"ms": 2594.0, "gflops": 304.0}}, "step summary")
    expect(parse_step_summary(summary, "onednn-matmul-f32")["llama"] == {"ms": 2542.0, "gflops": 287.0},
           "step summary, second backend")

    expect(percent_of(247.5, 300.0) == "  82.5%" and percent_of(1.0, None) == "      -", "percent column")

    # --torch-python: an interpreter without torch is refused up front, naming the flag and the interpreter.
    bad = subprocess.run([sys.executable, os.path.abspath(__file__), "--torch-python", "/bin/false", "--skip-gale",
                          "--configs", "gpt"], capture_output=True, text=True, timeout=120)
    expect(bad.returncode == 2 and "--torch-python: /bin/false cannot import torch" in bad.stderr,
           f"--torch-python without torch must be refused: rc {bad.returncode}, {bad.stderr.strip()[-200:]}")

    # The tuned PyTorch environment names the OpenBLAS core from the CPU flags.
    env, notes = torch_env(2, "tuned")
    expect(env["OMP_NUM_THREADS"] == "2" and env["OPENBLAS_NUM_THREADS"] == "2", "torch threads")
    if "avx512f" in cpu_flags():
        expect(env.get("OPENBLAS_CORETYPE") in ("SkylakeX", "Cooperlake"), "OPENBLAS_CORETYPE on AVX-512")

    for f in failures:
        print("FAIL:", f)
    print("self-test:", "FAILED" if failures else "passed", f"({len(failures)} failures)")
    return 1 if failures else 0


# ---------------------------------------------------------------------------------------------


def main():
    ap = argparse.ArgumentParser(description="Gale vs PyTorch eager: tokens/s, GFLOP/s, MFU and peak memory.")
    ap.add_argument("--gale", default=os.path.join(REPO, "build", "bin", "gale"), help="the gale binary")
    ap.add_argument("--bench-dir", default=os.path.join(REPO, "build", "bench"),
                    help="where fma_peak_bench and gemm_bench are")
    ap.add_argument("--configs", default="gpt,llama", help="comma-separated: gpt, llama")
    ap.add_argument("--extra-run", action="append", default=[], metavar="FLAGS",
                    help="one more Gale run at --optimization-level 2 with these extra flags (e.g. --extra-run=--bf16; the '=' keeps argparse from reading the value as an option); "
                         "repeatable; reported as 'gale -O2 FLAGS'")
    ap.add_argument("--levels", default="0,1,2",
                    help="Gale --optimization-level values; 'none' runs without the flag. Rejected levels are "
                         "skipped; when every level is rejected Gale runs once without the flag")
    ap.add_argument("--warmup", type=int, default=2, help="untimed iterations first")
    ap.add_argument("--iters", type=int, default=5, help="timed iterations")
    ap.add_argument("--threads", type=int, default=len(os.sched_getaffinity(0)))
    ap.add_argument("--torch-env", default="tuned", help="tuned (default), passive or system; see bench/README.md")
    ap.add_argument("--torch-attention", default="auto", choices=["auto", "sdpa", "explicit"],
                    help="PyTorch's attention: sdpa (F.scaled_dot_product_attention, causal; torch >= 2.0), "
                         "explicit (matmul, masked softmax, matmul) or auto (default: sdpa where torch has it)")
    ap.add_argument("--torch-python", action="append", default=[], metavar="PYTHON",
                    help="run the PyTorch side with this interpreter's torch (e.g. a venv with PyPI's torch); "
                         "repeatable, one PyTorch row each (named by torch version); default: this interpreter")
    ap.add_argument("--skip-torch", action="store_true")
    ap.add_argument("--no-sgemm-probe", action="store_true",
                    help="do not probe the fc1 sgemm rate around each run (then /sgemm uses the global rate)")
    ap.add_argument("--skip-gale", action="store_true")
    ap.add_argument("--timeout", type=float, default=900, help="seconds per training process")
    ap.add_argument("--repeats", type=int, default=1, help="run each training process N times, keep the fastest")
    ap.add_argument("--wait-quiet", type=float, default=0, metavar="SECONDS",
                    help="before each measurement wait up to SECONDS until other processes leave the CPUs idle "
                         "(for a shared machine)")
    ap.add_argument("--json", help="also write all results to this file")
    ap.add_argument("--self-test", action="store_true", help="check the harness against a fake gale and exit")
    ap.add_argument("--dropout", type=float, default=0.0,
                    help="--attention-dropout and --hidden-dropout for both sides (default 0; Megatron's default "
                         "is 0.1)")
    ap.add_argument("--worker", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    args = ap.parse_args()

    if args.self_test:
        return self_test()
    if args.worker == "torch":
        torch_worker(args)
        return 0
    if not 0.0 <= args.dropout < 1.0:
        ap.error(f"--dropout: expected a probability in [0, 1), found {args.dropout}")
    for c in CONFIGS.values():
        c.dropout = args.dropout

    configs = [x for x in args.configs.split(",") if x]
    for name in configs:
        if name not in CONFIGS:
            ap.error(f"--configs: expected names from {sorted(CONFIGS)}, found '{name}'")
    levels = []
    for x in args.levels.split(","):
        if x == "none":
            levels.append(None)
        elif x.isdigit():
            levels.append(int(x))
        elif x:
            ap.error(f"--levels: expected 'none' or integers, found '{x}'")
    if args.warmup < 0 or args.iters < 1:
        ap.error("--warmup must be >= 0 and --iters >= 1")
    if not args.skip_gale and not os.access(args.gale, os.X_OK):
        ap.error(f"--gale: {args.gale} is not an executable (build it: scripts/build.sh, or pass --skip-gale)")

    if args.repeats < 1:
        ap.error("--repeats must be >= 1")
    torch_pythons = []  # (interpreter, row name)
    if not args.skip_torch and not args.torch_python:
        if importlib.util.find_spec("torch") is None:
            ap.error(f"PyTorch is not importable by {sys.executable}: run this script with Debian's /usr/bin/python3 "
                     "(python3-torch; scripts/install-deps.sh --bench), or pass --torch-python or --skip-torch")
        torch_pythons.append((sys.executable, "pytorch eager"))
    for py in [] if args.skip_torch else args.torch_python:
        try:
            probe = subprocess.run([py, "-c", "import torch; print(torch.__version__)"], capture_output=True,
                                   text=True, timeout=120)
        except OSError as e:
            ap.error(f"--torch-python: cannot run {py}: {e}")
        if probe.returncode != 0:
            ap.error(f"--torch-python: {py} cannot import torch: "
                     f"{(probe.stderr.strip().splitlines() or ['?'])[-1]}")
        row = f"pytorch {probe.stdout.strip()}"[:20]
        if any(row == r for _, r in torch_pythons):  # the same torch twice: tell the rows apart
            row = f"{row[:16]} #{len(torch_pythons) + 1}"
        torch_pythons.append((py, row))

    def best_of(run, config):
        """The fastest of --repeats runs (each after waiting for a quiet machine with --wait-quiet), each
        between two sgemm probes: its /sgemm is against the faster probe, as the machine's speed drifts."""
        best = None
        for _ in range(args.repeats):
            if args.wait_quiet:
                wait_until_quiet(args.wait_quiet)
            probe = not args.no_sgemm_probe
            before = measure_fc1_sgemm(args.bench_dir, args.threads, config) if probe else None
            step_before = measure_step_sgemm(args.bench_dir, args.threads, config) if probe else None
            r = run()
            after = measure_fc1_sgemm(args.bench_dir, args.threads, config) if probe else None
            step_after = measure_step_sgemm(args.bench_dir, args.threads, config) if probe else None
            probes = [x for x in (before, after) if x]
            if probes:
                r["sgemm_probes"] = probes
                r["sgemm_fc1_gflops"] = max(probes)
            step_probes = [x for x in (step_before, step_after) if x]
            if step_probes:
                r["step_sgemm_probes"] = step_probes
                r["step_sgemm_gflops"] = max(step_probes)
            if "tokens_per_s" not in r:
                return r
            if best is None or r["tokens_per_s"] > best["tokens_per_s"]:
                best = r
        return best

    peak, peak_isa = measure_fma_peak(args.bench_dir, args.threads, args.wait_quiet)
    print(f"FP32 FMA peak: {peak:.1f} GFLOP/s ({peak_isa}, {args.threads} threads)", flush=True)
    sgemm, step_gemm = measure_sgemm(args.bench_dir, args.threads, configs, args.wait_quiet)
    all_results = {"fma_peak_gflops": peak, "threads": args.threads, "configs": {}}
    for name in configs:
        c = CONFIGS[name]
        results = []
        for py, row in torch_pythons:
            print(f"[{name}] {row} ...", flush=True)
            results.append(best_of(lambda: run_torch(c, args.warmup, args.iters, args.threads, args.torch_env,
                                                     args.timeout, args.torch_attention, py, row), name))
        if not args.skip_gale:
            gale_results = []
            for level in levels:
                print(f"[{name}] gale {'' if level is None else f'--optimization-level {level}'} ...", flush=True)
                gale_results.append(best_of(lambda: run_gale(args.gale, c, level, args.warmup, args.iters, args.threads,
                                                             args.timeout), name))
            for extra in args.extra_run:
                flags = shlex.split(extra)
                print(f"[{name}] gale --optimization-level 2 {extra} ...", flush=True)
                gale_results.append(best_of(lambda: run_gale(args.gale, c, 2, args.warmup, args.iters, args.threads,
                                                             args.timeout, flags), name))
            if gale_results and all("skipped" in r for r in gale_results):  # the flag does not exist yet
                print(f"[{name}] gale (no --optimization-level) ...", flush=True)
                gale_results.append(best_of(lambda: run_gale(args.gale, c, None, args.warmup, args.iters, args.threads,
                                                             args.timeout), name))
            results += gale_results
        # The machine's speed drifts over minutes: measure sgemm again after the runs and compare
        # against the faster of the two (the stricter /sgemm).
        sgemm_after, step_after = measure_sgemm(args.bench_dir, args.threads, [name], args.wait_quiet)
        rates = [r for r in (sgemm.get(name), sgemm_after.get(name)) if r]
        steps = [s for s in (step_gemm.get(name), step_after.get(name)) if s]
        sgemm[name] = max(rates) if rates else None
        step_gemm[name] = min(steps, key=lambda s: s["ms"]) if steps else None
        print(f"[{name}] onednn sgemm fc1 forward before / after the runs: "
              + " / ".join(f"{r:.1f}" for r in rates) + " GFLOP/s (the faster is used)", flush=True)
        print_report(c, results, peak, peak_isa, sgemm.get(name), step_gemm.get(name), args.threads)
        all_results["configs"][name] = {"megatron_flops_per_iteration": megatron_flops_per_iteration(c),
                                        "sgemm_fc1_gflops": sgemm.get(name), "step_gemm": step_gemm.get(name),
                                        "results": results}
    if args.json:
        with open(args.json, "w") as f:
            json.dump(all_results, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
