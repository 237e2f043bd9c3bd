# The flags of Megatron-LM's `pretrain_gpt.py` parser, for tests/train/megatron_flags_test.cc: every
# `add_argument('--name', ...)` of megatron/training/arguments.py (read with Python's ast, nothing of
# Megatron is run), one name per line, sorted.
#
#   python3 tools/reference/megatron_flags.py /path/to/Megatron-LM > tests/data/reference/megatron_flags_core_v0.12.1.txt
#
# (Megatron-LM at tag core_v0.12.1, the version docs and ../shared/reference/megatron.md target.)
#
# tests/data/reference/megatron_flags_main.txt is the same list at Megatron-LM main (the commit its `#` header line
# names, for tests/train/megatron_main_flags_test.cc), less the flags other branches were adding when it was made.
import ast
import sys

source = open(sys.argv[1] + "/megatron/training/arguments.py").read()
flags = set()
for node in ast.walk(ast.parse(source)):
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "add_argument":
        for arg in node.args:
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str) and arg.value.startswith("--"):
                flags.add(arg.value)
print("\n".join(sorted(flags)))
