#!/usr/bin/python3
"""The fewest rows a balanced placement of ONE causal document must move (issue 44's bytes goal).

A document of B equal blocks is placed over P ranks of B/P blocks each (every rank holds the same
number of rows, as ctxpar's placements do). Block b's causal work is 2b + 1 (pairs, in units of
half a block squared, the pairs within a block counted as the block's own half). A rank whose
highest block is m must see blocks 0..m, so with the visible-keys (frugal) exchange it receives
m + 1 - B/P blocks. Every placement is enumerated (ranks unordered); for each imbalance bound
(max / mean of the ranks' work) the least total received is printed, against the plain ring's
(P - 1) * B (every rank receives every other rank's rows).

usage: placement_bound.py B P [--expect RATIO]
  --expect: exit 1 unless the least ratio within an imbalance of 1.05 is RATIO (to 3 digits).
Costs grow fast: B=16 P=4 takes about half a minute.
"""
import itertools
import sys


def least_bytes(B, P, bounds):
    k = B // P
    total = sum(2 * b + 1 for b in range(B))
    mean = total / P
    best = {eps: None for eps in bounds}

    def rec(rest, ranks):
        if not rest:
            imbalance = max(sum(2 * b + 1 for b in r) for r in ranks) / mean
            received = sum(max(r) + 1 - k for r in ranks)
            for eps in bounds:
                if imbalance <= eps + 1e-9 and (best[eps] is None or received < best[eps][0]):
                    best[eps] = (received, ranks)
            return
        first = rest[0]  # the rank that holds the lowest block left: each set of ranks once
        for others in itertools.combinations(rest[1:], k - 1):
            group = (first,) + others
            rec([x for x in rest if x not in group], ranks + [group])

    rec(list(range(B)), [])
    return best


def main(argv):
    if len(argv) < 3 or int(argv[1]) % int(argv[2]) != 0:
        print(__doc__)
        return 2
    B, P = int(argv[1]), int(argv[2])
    expect = float(argv[argv.index("--expect") + 1]) if "--expect" in argv else None
    bounds = (1.0, 1.05, 1.10, 1.20)
    best = least_bytes(B, P, bounds)
    ring = (P - 1) * B
    for eps in bounds:
        if best[eps] is None:
            print(f"B={B} P={P} imbalance <= {eps:.2f}: no placement")
            continue
        received, ranks = best[eps]
        print(f"B={B} P={P} imbalance <= {eps:.2f}: least rows received / ring {received / ring:.3f}, e.g. {ranks}")
    if expect is not None:
        got = best[1.05][0] / ring if best[1.05] else None
        if got is None or round(got, 3) != round(expect, 3):
            print(f"FAIL: least ratio within 1.05 is {got}, expected {expect}")
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
