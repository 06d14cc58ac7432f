"""A list schedule of the causal kernels' programs under four orders across heads: how far each puts the last program's
end over the bound (the work over the slots, or the longest program, whichever is larger). The figures in
docs/ops/attention.md, sessions 55 and 56, are this script's over the regime draw's 40 shapes
(scripts/attention_results.sh).

A head of N tokens is cut into blocks of `--block` rows; a causal block's work is the key blocks it reads (1 to NUM),
and the kernels number every head's longest first. The slots are programs that run at once (`--slots`, 2 an SM of
`--sms` by default); a free slot takes the next program in the order. No memory effects: the order across all heads
wins here and loses at many heads on a GPU (its programs' reads of K and V no longer fit L2; session 55's A/B).

    PYTHONPATH=src python scripts/attention_order_model.py --block 64 17x2x2x1914x1914x128 20x4x4x1344x1344x128
"""

from __future__ import annotations

import argparse
import heapq
import math
import statistics

from fuselab.ops.attention.triton_kernels import ORDER_SHARE, order_heads


def order(heads: int, num: int, group: int, merge_last: bool) -> list[int]:
    """The block index (0 the longest) of each program in launch order: groups of `group` heads, one after another,
    block by block within each; `merge_last`: the heads left over join the last group (else a smaller group of
    them)."""
    group = min(group, heads)
    count = max(heads // group, 1) if merge_last else math.ceil(heads / group)
    out: list[int] = []
    for g in range(count):
        size = heads - g * group if merge_last and g == count - 1 else min(group, heads - g * group)
        out += [b for b in range(num) for _ in range(size)]
    return out


def makespan(works: list[int], slots: int) -> float:
    """When the last program ends, each program taking the next free slot in turn."""
    free = [0.0] * slots
    end = 0.0
    for w in works:
        t = heapq.heappop(free) + w
        end = max(end, t)
        heapq.heappush(free, t)
    return end


def orders(heads: int, num: int, sms: int) -> dict[str, list[int]]:
    """The orders compared: head by head, across all heads, groups of sms / ORDER_SHARE heads with a smaller last
    group (3ff3bbc), and the kernels' own (fa8c98f on): groups of `order_heads` heads, the heads left over in the
    last."""
    return {
        "head by head": order(heads, num, 1, False),
        "across all": order(heads, num, heads, False),
        "groups": order(heads, num, max(1, sms // ORDER_SHARE), False),
        "groups, tail rule": order(heads, num, order_heads(sms, num), True),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("shapes", nargs="+", help="B x Hq x Hkv x Nq x Nk x d, causal")
    parser.add_argument("--block", type=int, default=64, help="rows a block (the kernel's block_m or block_n)")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--slots", type=int, default=0, help="programs at once (default 2 an SM)")
    args = parser.parse_args()
    slots = args.slots or 2 * args.sms
    over: dict[str, list[float]] = {}
    for shape in args.shapes:
        b, hq, _, n, _, _ = (int(x) for x in shape.split("x"))
        heads, num = b * hq, math.ceil(n / args.block)
        bound = max(heads * num * (num + 1) / 2 / slots, num)
        row = {
            name: makespan([num - i for i in ids], slots) / bound for name, ids in orders(heads, num, args.sms).items()
        }
        for name, value in row.items():
            over.setdefault(name, []).append(value)
        print(f"{shape:>24} {heads:5d} heads  " + "  ".join(f"{k} {v:.3f}" for k, v in row.items()))
    if len(args.shapes) > 1:
        print("median / worst: " + "; ".join(f"{k} {statistics.median(v):.3f} / {max(v):.3f}" for k, v in over.items()))


if __name__ == "__main__":
    main()
