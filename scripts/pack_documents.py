#!/usr/bin/python3
"""Packs a directory of real text files into a token file `ctxpar train` reads: one file is one
document, its bytes are its tokens (0-255), and an end-of-document token follows each.

    /usr/bin/python3 scripts/pack_documents.py SRC_DIR OUT.bin [--ext .c,.h,.py,.md] [--eos 256]
                                               [--max-doc-bytes 1M] [--max-total-bytes 256M]

Then, e.g.:
    mpirun -np 2 build/ctxpar train --config inputs/tiny.toml vocab=512 data=OUT.bin data_dtype=uint16 \\
        eos_id=256 docs=none seq=8K

Files are taken in sorted path order (the same file on every run), empty files and files with a
NUL byte in their first 8 KiB (binaries) are skipped, and a file longer than --max-doc-bytes is
cut there. Beside OUT.bin it writes OUT.docs.csv (path, first token, tokens without the
end-of-document token) and prints the length distribution: real source trees and corpora are
long-tailed (most documents short, a few as long as a batch), which is what placement of packed
documents over CP ranks has to handle. The vocabulary must exceed --eos (vocab=512 for 256).
"""
import argparse
import csv
import os
import sys

import numpy as np


def size_arg(text: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    t = text.strip().upper()
    try:
        return int(t[:-1]) * mult[t[-1]] if t and t[-1] in mult else int(t)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a size such as 4096, 64K or 1M, not {text!r}")


def documents(src: str, exts, max_doc: int):
    """(relative path, bytes) of every text file under src, in sorted path order."""
    paths = []
    for root, dirs, files in os.walk(src):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        paths += [os.path.relpath(os.path.join(root, n), src) for n in files
                  if not exts or any(n.endswith(e) for e in exts)]
    for rel in sorted(paths):
        path = os.path.join(src, rel)
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, "rb") as f:
            data = f.read(max_doc)
        if not data or b"\0" in data[:8192]:
            continue
        yield rel, data


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("src", help="directory of text files (searched recursively; dot directories skipped)")
    ap.add_argument("out", help="token file to write (.bin, uint16)")
    ap.add_argument("--ext", default="", help="comma list of file name endings to take (default: every text file)")
    ap.add_argument("--eos", type=int, default=256, help="end-of-document token (default 256; > 255)")
    ap.add_argument("--max-doc-bytes", type=size_arg, default=1 << 20, help="cut longer files here (default 1M)")
    ap.add_argument("--max-total-bytes", type=size_arg, default=256 << 20, help="stop after this many tokens (default 256M)")
    a = ap.parse_args()
    if not os.path.isdir(a.src):
        print(f"pack_documents: {a.src!r} is not a directory; give a directory of text files", file=sys.stderr)
        return 2
    if not 256 <= a.eos < 65536:
        print(f"pack_documents: --eos {a.eos} must be in [256, 65535] (bytes are 0-255; the file is uint16)", file=sys.stderr)
        return 2
    if a.max_doc_bytes < 1 or a.max_total_bytes < 2:
        print("pack_documents: --max-doc-bytes and --max-total-bytes must be positive", file=sys.stderr)
        return 2
    exts = [e.strip() for e in a.ext.split(",") if e.strip()]
    parts, rows, total = [], [], 0
    for rel, data in documents(a.src, exts, a.max_doc_bytes):
        if total + len(data) + 1 > a.max_total_bytes:
            break
        parts.append(np.frombuffer(data, dtype=np.uint8).astype(np.uint16))
        parts.append(np.array([a.eos], dtype=np.uint16))
        rows.append((rel, total, len(data)))
        total += len(data) + 1
    if not rows:
        print(f"pack_documents: no text files under {a.src!r}" + (f" ending in {', '.join(exts)}" if exts else ""),
              file=sys.stderr)
        return 2
    write_token_file(a.out, parts, rows, a.eos)
    return 0


def write_token_file(out: str, parts, rows, eos: int) -> None:
    """Writes the documents `parts` (uint16 arrays, each followed by its end-of-document token) to
    `out` (atomically: a .partial renamed), their index `rows` (name, first token, tokens) to
    out.docs.csv, and prints the length distribution and how to use the file."""
    tokens = np.concatenate(parts)
    tmp = out + ".partial"
    tokens.tofile(tmp)
    os.replace(tmp, out)
    with open(out + ".docs.csv", "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["path", "first_token", "tokens"])
        w.writerows(rows)
    lengths = np.array([r[2] for r in rows])
    q = np.percentile(lengths, [50, 90, 99])
    print(f"{out}: {len(rows)} documents, {tokens.size} tokens (uint16, end-of-document {eos}); "
          f"document length min {lengths.min()}, median {q[0]:.0f}, p90 {q[1]:.0f}, p99 {q[2]:.0f}, max {lengths.max()}; "
          f"the longest 10% hold {100 * np.sort(lengths)[-max(1, len(rows) // 10):].sum() / lengths.sum():.0f}% of the tokens")
    print(f"use: data={out} data_dtype=uint16 eos_id={eos} docs=none vocab>={eos + 1}")


if __name__ == "__main__":
    sys.exit(main())
