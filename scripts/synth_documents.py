#!/usr/bin/python3
"""Writes a token file of documents whose lengths follow a given distribution, for `ctxpar predict
data=` and `ctxpar train data=` where the real corpus is not at hand but its length distribution
is published (a histogram, a list of lengths, or a log-normal's parameters). The tokens are seeded
random bytes (0-255), each document followed by the end-of-document token; only the lengths carry
information.

    /usr/bin/python3 scripts/synth_documents.py OUT.bin (--hist H.csv | --lengths L.txt |
        --lognormal MEAN SIGMA) [--clip LO HI] [--tokens 4M] [--seed 0] [--eos 256]

  --hist H.csv        rows lo,hi,count (a header row is skipped): a document falls in bucket
                      [lo, hi] with probability count / total, its length uniform within it
  --lengths L.txt     one length per line (or whitespace-separated), used in order, cycled
  --lognormal M S     lengths exp(N(mu, S^2)) rounded, mu = ln M - S^2 / 2 (mean M before any
                      clip; Megatron-LM's dynamic-CP example draws mean 1024, S = 1.5, clip 128-8192)
  --clip LO HI        lengths clipped to [LO, HI]

Documents are drawn until the file holds exactly --tokens tokens (with the end-of-document
tokens); the last document is cut (or lengthened by one token) to fit, so it alone may fall outside
the distribution and the clip. Beside OUT.bin it writes OUT.docs.csv as scripts/pack_documents.py
does.
"""
import argparse
import math
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from pack_documents import size_arg, write_token_file  # noqa: E402


def fail(msg: str) -> int:
    print(f"synth_documents: {msg}", file=sys.stderr)
    return 2


def read_hist(path: str):
    """[(lo, hi, count)] of a histogram CSV, or a message saying what is wrong."""
    rows = []
    with open(path) as f:
        for n, line in enumerate(f, 1):
            cells = [c.strip() for c in line.split(",")]
            if not line.strip():
                continue
            try:
                lo, hi, count = int(cells[0]), int(cells[1]), float(cells[2])
            except (ValueError, IndexError):
                if n == 1:
                    continue  # a header
                return None, f"{path}:{n}: expected lo,hi,count, not {line.strip()!r}"
            if not (1 <= lo <= hi < 2 ** 40) or not (math.isfinite(count) and count >= 0):
                return None, f"{path}:{n}: a bucket needs 1 <= lo <= hi < 2^40 and a finite count >= 0, not {line.strip()!r}"
            rows.append((lo, hi, count))
    if not rows or sum(r[2] for r in rows) <= 0:
        return None, f"{path}: no bucket with a positive count"
    return rows, ""


def draw(a, rng: np.random.Generator, n: int, cursor: list):
    """n document lengths of the chosen distribution."""
    if a.hist:
        lo, hi, w = (np.array(c, dtype=float) for c in zip(*a.buckets))
        k = rng.choice(len(w), size=n, p=w / w.sum())
        out = (lo[k] + np.floor(rng.random(n) * (hi[k] - lo[k] + 1))).astype(np.int64)
    elif a.lengths:
        idx = (cursor[0] + np.arange(n)) % len(a.values)
        cursor[0] += n
        out = a.values[idx]
    else:
        mean, sigma = a.lognormal
        out = np.rint(rng.lognormal(math.log(mean) - sigma * sigma / 2, sigma, n)).astype(np.int64)
    if a.clip:
        out = np.clip(out, a.clip[0], a.clip[1])
    return np.maximum(out, 1)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="token file to write (.bin, uint16)")
    src = ap.add_mutually_exclusive_group(required=True)
    src.add_argument("--hist", help="histogram CSV: lo,hi,count per bucket")
    src.add_argument("--lengths", help="file of document lengths")
    src.add_argument("--lognormal", type=float, nargs=2, metavar=("MEAN", "SIGMA"))
    ap.add_argument("--clip", type=int, nargs=2, metavar=("LO", "HI"))
    ap.add_argument("--tokens", type=size_arg, default=4 << 20, help="tokens to write (default 4M)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--eos", type=int, default=256, help="end-of-document token (default 256; > 255)")
    a = ap.parse_args()
    if not 256 <= a.eos < 65536:
        return fail(f"--eos {a.eos} must be in [256, 65535] (bytes are 0-255; the file is uint16)")
    if a.tokens < 2:
        return fail(f"--tokens {a.tokens} must be at least 2 (one token and its end-of-document token)")
    if a.seed < 0:
        return fail(f"--seed {a.seed} must be >= 0")
    if a.clip and not 1 <= a.clip[0] <= a.clip[1]:
        return fail(f"--clip {a.clip[0]} {a.clip[1]} needs 1 <= LO <= HI")
    if a.lognormal and not (a.lognormal[0] >= 1 and a.lognormal[1] > 0):
        return fail(f"--lognormal {a.lognormal[0]} {a.lognormal[1]} needs MEAN >= 1 and SIGMA > 0")
    for path in (a.hist, a.lengths):
        if path and not os.path.isfile(path):
            return fail(f"{path!r} is not a file")
    if a.hist:
        a.buckets, err = read_hist(a.hist)
        if err:
            return fail(err)
    if a.lengths:
        try:
            a.values = np.array(open(a.lengths).read().split(), dtype=np.int64)
        except (ValueError, OverflowError):
            return fail(f"{a.lengths}: expected integer lengths below 2^63, whitespace-separated")
        if a.values.size == 0 or a.values.min() < 1:
            return fail(f"{a.lengths}: needs at least one length, each >= 1")
    rng = np.random.default_rng(a.seed)
    parts, rows, total, cursor = [], [], 0, [0]
    while total < a.tokens:
        for n in draw(a, rng, 4096, cursor):
            left = a.tokens - total  # >= 2 here
            n = int(min(n, left - 1))
            if left - (n + 1) == 1:  # one token would remain, too few for a document: take it
                n += 1
            parts.append(rng.integers(0, 256, size=n, dtype=np.uint16))
            parts.append(np.array([a.eos], dtype=np.uint16))
            rows.append((f"synthetic:{len(rows)}", total, n))
            total += n + 1
            if total == a.tokens:
                break
    try:
        write_token_file(a.out, parts, rows, a.eos)
    except OSError as e:
        return fail(f"cannot write {a.out!r}: {e.strerror}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
