#!/usr/bin/env python3
"""Megatron-LM main's RL flags: writes tests/data/reference/megatron_rl_flags_main.txt.

Reads megatron/training/arguments.py from the Megatron-LM checkout (a git directory;
MEGATRON_LM_GIT, default /work/.mirror/NVIDIA+Megatron-LM/repo, at MEGATRON_LM_REV, default HEAD),
parses it with ast and lists every option string of _add_rl_args's add_argument calls (with the
--no- twin of each argparse.BooleanOptionalAction flag), plus --use-same-sampling-seed-across-dp-ranks
(the inference group's flag GRPO's sampling reads). tests/train/megatron_rl_flags_test.cc checks that
`gale pretrain` knows each one: runs it, notes it or refuses it in one line.

Usage: /usr/bin/python3 tools/reference/megatron_rl_flags.py
"""
import ast
import os
import subprocess

GIT = os.environ.get("MEGATRON_LM_GIT", "/work/.mirror/NVIDIA+Megatron-LM/repo")
REV = os.environ.get("MEGATRON_LM_REV", "HEAD")
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tests", "data", "reference",
                   "megatron_rl_flags_main.txt")


def main():
    src = subprocess.run(["git", "-C", GIT, "show", f"{REV}:megatron/training/arguments.py"], check=True,
                         capture_output=True, text=True).stdout
    fn = next(n for n in ast.parse(src).body if isinstance(n, ast.FunctionDef) and n.name == "_add_rl_args")
    flags = []
    for call in ast.walk(fn):
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute)
                and call.func.attr == "add_argument"):
            continue
        names = [a.value for a in call.args if isinstance(a, ast.Constant) and str(a.value).startswith("--")]
        optional = any(k.arg == "action" and isinstance(k.value, ast.Attribute)
                       and k.value.attr == "BooleanOptionalAction" for k in call.keywords)
        for name in names:
            flags.append(name)
            if optional:
                flags.append("--no-" + name[2:])
    flags.append("--use-same-sampling-seed-across-dp-ranks")
    with open(OUT, "w") as f:
        f.write("\n".join(flags) + "\n")
    print("wrote", os.path.normpath(OUT), len(flags), "flags")


if __name__ == "__main__":
    main()
