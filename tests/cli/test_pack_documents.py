#!/usr/bin/env python3
"""scripts/pack_documents.py: a directory of text files becomes the token file train reads — each
file's bytes then the end-of-document token, in sorted path order; binaries, empty files and dot
directories skipped; long files cut; the .docs.csv index matches; bad input exits 2; and
`ctxpar train` trains on the file with eos_id (documents split at it).
Usage: test_pack_documents.py CTXPAR_BINARY"""
import csv
import os
import subprocess
import sys
import tempfile

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPT = os.path.join(HERE, "..", "..", "scripts", "pack_documents.py")
exe = sys.argv[1]
fails = []


def check(cond, what):
    if not cond:
        fails.append(what)


def pack(*args):
    return subprocess.run([sys.executable, SCRIPT] + list(args), capture_output=True, text=True)


tmp = tempfile.mkdtemp(prefix="ctxpar-pack-")
src = os.path.join(tmp, "tree")
files = {"b/z.txt": b"zz\n" * 500, "a.py": b"print('a')\n" * 400, "b/c/long.md": bytes(range(32, 127)) * 60,
         "empty.txt": b"", "bin.dat": b"\x7fELF\0\0\1", ".git/HEAD": b"ref: x\n"}
for rel, data in files.items():
    os.makedirs(os.path.dirname(os.path.join(src, rel)), exist_ok=True)
    with open(os.path.join(src, rel), "wb") as f:
        f.write(data)
out = os.path.join(tmp, "tok.bin")
r = pack(src, out, "--max-doc-bytes", "4K")
check(r.returncode == 0 and "3 documents" in r.stdout, "packs the three text files:\n" + r.stdout + r.stderr)
tokens = np.fromfile(out, dtype=np.uint16)
want = []
for rel in ("a.py", "b/c/long.md", "b/z.txt"):  # sorted path order; long.md cut at 4K
    want += list(files[rel][:4096]) + [256]
check(tokens.tolist() == want, "tokens = each file's bytes then 256, in path order, cut at --max-doc-bytes")
rows = list(csv.DictReader(open(out + ".docs.csv")))
check([r["path"] for r in rows] == ["a.py", os.path.join("b", "c", "long.md"), os.path.join("b", "z.txt")],
      "the index lists the documents in order: %s" % rows)
check(all(tokens[int(r["first_token"]) + int(r["tokens"])] == 256 for r in rows), "each indexed document ends at an eos")
r = pack(src, os.path.join(tmp, "py.bin"), "--ext", ".py")
check(r.returncode == 0 and np.fromfile(os.path.join(tmp, "py.bin"), dtype=np.uint16).size == len(files["a.py"]) + 1,
      "--ext takes only those files")
for args, what in (([os.path.join(tmp, "nope"), out], "a missing directory"), ([src, out, "--eos", "12"], "an eos among the bytes"),
                   ([src, out, "--ext", ".none"], "no matching file"), ([src, out, "--max-doc-bytes", "x"], "a bad size")):
    r = pack(*args)
    check(r.returncode == 2 and "Traceback" not in r.stderr, f"{what} exits 2 with a message: {r.returncode} {r.stderr}")
check(np.fromfile(out, dtype=np.uint16).tolist() == want, "a refused call leaves the earlier token file as it was")

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
cmd = ["mpirun", "-np", "2", "--oversubscribe", "--bind-to", "none", exe, "train", "layers=1", "dim=64", "ffn_dim=128",
       "heads=4", "kv_heads=2", "head_dim=16", "vocab=512", "seq=1K", "steps=2", "warmup=0", "docs=none",
       "data=" + out, "data_dtype=uint16", "eos_id=256", "out=" + os.path.join(tmp, "train.h5")]
p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
check(p.returncode == 0 and "VALID" in p.stdout, "train reads the packed file with eos_id=256:\n" + p.stdout[-2000:] + p.stderr[-2000:])
# The coverage audit on real documents: every step's pairs x heads computed equal the expected ones.
if p.returncode == 0:
    import h5py
    with h5py.File(os.path.join(tmp, "train.h5")) as f:
        cov = f["coverage"][:]
        cols = f["coverage"].attrs["columns"]
        verdict, imb = f.attrs["coverage_audit"], float(f.attrs["attn_work_imbalance"])
    check(cols == "step,attn_pair_heads_computed,attn_pair_heads_expected,attn_work_imbalance", "coverage columns: " + cols)
    check(len(cov) == 2 and all(r[1] == r[2] > 0 and r[3] >= 1 for r in cov), "every step audited and exact: %s" % cov)
    check(verdict == "passed every step" and imb >= 1, "the trace records the audit and the imbalance")

if fails:
    print("FAILED:\n  " + "\n  ".join(fails))
    sys.exit(1)
print("pack_documents: all checks passed")
