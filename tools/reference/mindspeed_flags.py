# The flags of MindSpeed's feature inventory, for tests/train/mindspeed_flags_test.cc: every `--name`
# in section 2 ("Feature inventory", including 2.8, the legacy core_r0.7/r0.8 features) of the
# collected MindSpeed facts, one name per line, sorted.
#
#   python3 tools/reference/mindspeed_flags.py ../shared/reference/mindspeed.md > tests/data/reference/mindspeed_flags.txt
import re
import sys

text = open(sys.argv[1]).read()
start = text.index("\n## 2. ")
end = text.index("\n## 3. ", start)
flags = set(re.findall(r"--[a-z0-9][a-z0-9-]*[a-z0-9]", text[start:end]))
print("\n".join(sorted(flags)))
