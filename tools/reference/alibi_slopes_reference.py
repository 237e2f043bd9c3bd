"""ALiBi slopes for tests/kernels/reference_grad_test.cc (AlibiSlopes): Press et al.'s get_slopes rule
(the one MindSpeed uses, Python doubles rounded to float32) and Hugging Face Bloom's build_alibi_tensor
rule (float32 torch.pow), written out independently here; prints the float32 literals and the largest
difference between the two rules (Bloom's float32 powers may differ by a rounding)."""
import math

import torch


def press_slopes(n):
    def power_of_two(n):
        first = 2.0 ** (-(2.0 ** -(math.log2(n) - 3)))
        return [first ** (i + 1) for i in range(n)]

    if math.log2(n).is_integer():
        return power_of_two(n)
    p = 2 ** math.floor(math.log2(n))
    return power_of_two(p) + press_slopes(2 * p)[0::2][: n - p]


def bloom_slopes(n):
    p = 2 ** math.floor(math.log2(n))
    base = torch.tensor(2.0 ** (-(2.0 ** -(math.log2(p) - 3))), dtype=torch.float32)
    s = torch.pow(base, torch.arange(1, 1 + p, dtype=torch.int32))
    if p != n:
        extra = torch.tensor(2.0 ** (-(2.0 ** -(math.log2(2 * p) - 3))), dtype=torch.float32)
        rest = min(p, n - p)
        s = torch.cat([s, torch.pow(extra, torch.arange(1, 1 + 2 * rest, 2, dtype=torch.int32))])
    return s


for n in [1, 8, 12, 16, 20]:
    press = torch.tensor(press_slopes(n), dtype=torch.float64).to(torch.float32)
    diff = (press - bloom_slopes(n)).abs().max().item()
    print(f"  // NH = {n} (Bloom's float32 rule differs by at most {diff:.3g})")
    print("  {" + ", ".join(f"{x:.9e}f" for x in press.tolist()) + "},")
