#!/usr/bin/env python3
"""scripts/pack_documents.py: a directory of text files becomes the token file train reads — each
file's bytes then the end-of-document token, in sorted path order; binaries, empty files and dot
directories skipped; long files cut; the .docs.csv index matches; bad input exits 2; and
`ctxpar train` trains on the file with eos_id (documents split at it); on a long-tailed tree,
`ctxpar predict data=` places its batches (balanced evens what zigzag leaves uneven) and train runs
them with placement=balanced (and auto, and document: every document over every rank), audited every
step, and scripts/placement_study.py compares the layouts with bench cp; scripts/synth_documents.py
writes the same kind of file from a length distribution (histogram, list, log-normal).
Usage: test_pack_documents.py CTXPAR_BINARY"""
import csv
import math
import os
import re
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

# A long-tailed tree (many short files, a few long): `predict data=` places its batches, zigzag
# against balanced, and train runs them balanced with the audit passing every step.
tail = os.path.join(tmp, "tail")
os.makedirs(tail)
for i in range(60):
    with open(os.path.join(tail, "f%02d.txt" % i), "wb") as f:
        f.write(bytes([97 + i % 26]) * (40 + (i * 7919) % 600 + (3000 if i % 13 == 0 else 0)))
tail_bin = os.path.join(tmp, "tail.bin")
check(pack(tail, tail_bin).returncode == 0, "packs the long-tailed tree")
p = subprocess.run([exe, "predict", "data=" + tail_bin, "eos_id=256", "seq=4K", "predict_mesh=ring:4", "vocab=512", "csv=true"],
                   capture_output=True, text=True, timeout=120)
rows = [l for l in p.stdout.splitlines() if l and not l.startswith("#")]
place = list(csv.DictReader(rows[rows.index(next(l for l in rows if l.startswith("ranks,"))):]))
check(p.returncode == 0 and len(place) == 1, "predict prints one placement row:\n" + p.stdout[-2000:] + p.stderr[-1000:])
if place:
    r = place[0]
    zw, bw, bworst = float(r["zigzag_work"]), float(r["balanced_work"]), float(r["balanced_worst"])
    check(r["ranks"] == "4" and r["seq"] == "4096" and int(r["batches"]) >= 4, "the row names the group, length, batches: %s" % r)
    check(zw > 1.05 and bw <= 1.02 and bworst <= max(1.02, float(r["zigzag_worst"])) and float(r["attn_gain"]) > 1,
          "balanced evens what zigzag leaves uneven: %s" % r)
    # Step times priced per placement: the frugal ring moves at most the ring's rows, and auto takes
    # the cheaper of frugal and balanced per batch, so its median is at most either's.
    ring, frugal, bal, auto = (float(r[k]) for k in ("step_ring_ms", "step_frugal_ms", "step_balanced_ms", "step_auto_ms"))
    check(0 < frugal <= ring and 0 < auto <= min(frugal, bal) and 0 <= float(r["auto_balanced"]) <= 1,
          "the placements' step times are consistent: %s" % r)
cmd = ["mpirun", "-np", "4", "--oversubscribe", "--bind-to", "none", exe, "train", "layers=1", "dim=64", "ffn_dim=128",
       "heads=4", "kv_heads=2", "head_dim=16", "vocab=512", "seq=4K", "steps=3", "warmup=0", "docs=none", "data=" + tail_bin,
       "eos_id=256", "strategy=ring", "frugal=true", "placement=balanced", "out=" + os.path.join(tmp, "bal.h5")]
p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=300)
check(p.returncode == 0 and "VALID" in p.stdout and "placement balanced" in p.stdout,
      "train places the batches balanced:\n" + p.stdout[-2000:] + p.stderr[-2000:])
if p.returncode == 0:
    import h5py
    with h5py.File(os.path.join(tmp, "bal.h5")) as f:
        check(f.attrs["coverage_audit"] == "passed every step", "the balanced run passes the audit every step")

# placement=auto: the same batches, each on the placement the cost model prices cheaper; the log
# counts them, and the audit passes every step.
p = subprocess.run(cmd[:-2] + ["placement=auto", "out=" + os.path.join(tmp, "auto.h5")], env=env, capture_output=True,
                   text=True, timeout=300)
m = re.search(r"placement auto: (\d+) of (\d+) batches", p.stdout)
check(p.returncode == 0 and "VALID" in p.stdout and m is not None and m.group(2) == "3",
      "train places the batches by the cost model:\n" + p.stdout[-2000:] + p.stderr[-2000:])

# placement=document (every document zigzag over all ranks, the frameworks' layout): predict's
# columns, train on it with the audit, and scripts/placement_study.py comparing it with balanced
# on the same batches (every row against the single-rank kernel: #wrong 0).
if place:
    r = place[0]
    check(float(r["document_work"]) <= 1.02 and 0 < float(r["step_document_ms"]),
          "the document layout is balanced per document: %s" % r)
p = subprocess.run(cmd[:-2] + ["placement=document", "out=" + os.path.join(tmp, "doc.h5")], env=env, capture_output=True,
                   text=True, timeout=300)
check(p.returncode == 0 and "VALID" in p.stdout and "placement document" in p.stdout,
      "train places every document over every rank:\n" + p.stdout[-2000:] + p.stderr[-2000:])
study = os.path.join(HERE, "..", "..", "scripts", "placement_study.py")
p = subprocess.run([sys.executable, study, exe, tail_bin, "--seq", "4K", "--np", "2", "--batches", "2", "--steps", "1",
                    "--placements", "balanced,document", "--out", os.path.join(tmp, "study.h5")],
                   env=env, capture_output=True, text=True, timeout=300)
summary = {l.split()[0]: l.split() for l in p.stdout.splitlines() if l.startswith("  ring")}
check(p.returncode == 0 and set(summary) == {"ring", "ring:frugal", "ring:balanced", "ring:document"}
      and all(v[-1] == "0" for v in summary.values()),
      "placement_study.py compares the layouts, #wrong 0:\n" + p.stdout[-2000:] + p.stderr[-1000:])

# scripts/synth_documents.py: a token file from a published length distribution (a histogram, a
# list of lengths, a log-normal): the lengths follow it, the file reads as pack_documents' does,
# predict places it; bad input exits 2.
SYNTH = os.path.join(HERE, "..", "..", "scripts", "synth_documents.py")


def synth(*args):
    return subprocess.run([sys.executable, SYNTH] + list(args), capture_output=True, text=True)


def doc_lengths(path):
    t = np.fromfile(path, dtype=np.uint16)
    ends = np.flatnonzero(t == 256)
    return t, np.diff(np.concatenate([[-1], ends])) - 1


hist = os.path.join(tmp, "hist.csv")
with open(hist, "w") as f:
    f.write("lo,hi,count\n10,20,3\n300,300,1\n5000,6000,0\n")
hbin = os.path.join(tmp, "hist.bin")
r = synth(hbin, "--hist", hist, "--tokens", "64K", "--seed", "7")
t, lens = doc_lengths(hbin)
check(r.returncode == 0 and t.size == 64 * 1024 and t[-1] == 256 and t.max() == 256, "synth --hist writes 64K tokens:\n" + r.stderr)
full = lens[:-1]  # the last may be cut to fit
check(((full >= 10) & (full <= 20) | (full == 300)).all(), "every length in a bucket with a count: %s" % np.unique(full)[:20])
# Sampling bounds (tests/README.md: 4 standard errors of the estimate, whatever the seed): a share
# p of n draws within 4 sqrt(p (1 - p) / n), a median within 4 / (2 f(m) sqrt(n)) (f the density there).
share, se = (full == 300).mean(), math.sqrt(0.25 * 0.75 / full.size)
check(abs(share - 0.25) <= 4 * se, "the 300 bucket holds 1 in 4 documents: %.3f (4 SE = %.3f)" % (share, 4 * se))
rows = list(csv.DictReader(open(hbin + ".docs.csv")))
check(len(rows) == len(lens) and [int(x["tokens"]) for x in rows] == lens.tolist(), "the index matches the documents")
lbin = os.path.join(tmp, "list.bin")
with open(os.path.join(tmp, "lens.txt"), "w") as f:
    f.write("5 700\n3\n")
check(synth(lbin, "--lengths", os.path.join(tmp, "lens.txt"), "--tokens", "2K").returncode == 0
      and doc_lengths(lbin)[1][:6].tolist() == [5, 700, 3, 5, 700, 3], "synth --lengths uses them in order, cycled")
nbin = os.path.join(tmp, "logn.bin")
r = synth(nbin, "--lognormal", "1024", "1.5", "--clip", "128", "8192", "--tokens", "8M")
_, lens = doc_lengths(nbin)
med = 1024 * math.exp(-1.5 ** 2 / 2)  # exp(mu): the clip at 128 (26% of draws) leaves the median
half = 4 / (2 * (1 / (med * 1.5 * math.sqrt(2 * math.pi))) * math.sqrt(lens.size))
check(r.returncode == 0 and lens[:-1].min() >= 128 and lens.max() <= 8192 and abs(np.median(lens[:-1]) - med) <= half,
      "synth --lognormal 1024 1.5 clipped to 128-8192: median %.0f, want %.0f +- %.0f: %s" %
      (np.median(lens), med, half, r.stderr))
for args, what in (([hbin], "no distribution"), ([hbin, "--hist", os.path.join(tmp, "nope.csv")], "a missing histogram"),
                   ([hbin, "--lognormal", "0", "1"], "a mean below 1"), ([hbin, "--hist", hist, "--clip", "9", "3"], "a bad clip"),
                   ([hbin, "--lengths", hist], "lengths that are not integers")):
    r = synth(*args)
    check(r.returncode == 2 and "Traceback" not in r.stderr, f"synth with {what} exits 2 with a message: {r.returncode} {r.stderr}")
p = subprocess.run([exe, "predict", "data=" + nbin, "eos_id=256", "seq=8K", "predict_mesh=ring:4", "vocab=512", "csv=true"],
                   capture_output=True, text=True, timeout=120)
check(p.returncode == 0 and "\n4,8192," in p.stdout, "predict places the synthetic batches:\n" + p.stdout[-1500:] + p.stderr[-800:])

if fails:
    print("FAILED:\n  " + "\n  ".join(fails))
    sys.exit(1)
print("pack_documents: all checks passed")
