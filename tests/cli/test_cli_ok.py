#!/usr/bin/env python3
"""Good input: --help, --features, --print-config and --dry-run exit 0, print on rank 0 only, write nothing.
Usage: test_cli_ok.py CTXPAR_BINARY"""
import os
import re
import subprocess
import sys
import tempfile

env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1", COLUMNS="80")
failures = []
checks = 0


def run(np, args):
    cmd = ["mpirun", "-np", str(np), "--oversubscribe", "--bind-to", "none", sys.argv[1]] + args
    p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60)
    return p.returncode, p.stdout + p.stderr


def expect(cond, what, text):
    global checks
    checks += 1
    if not cond:
        failures.append(what)
        print("FAIL:", what, "\n---\n" + text + "\n---")


tmp = tempfile.mkdtemp(prefix="ctxpar-ok-")
out = os.path.join(tmp, "x.h5")

rc, text = run(2, ["--help"])
expect(rc == 0 and text.count("usage: ctxpar") == 1, "--help prints usage once and exits 0", text)
expect("strategy" in text and "allgather|ulysses|ring|usp" in text, "--help lists fields with choices", text)

rc, text = run(2, ["train", "--help"])  # COLUMNS=80 in env: an 80-column terminal
expect(rc == 0 and text.count("usage: ctxpar train") == 1 and "\ntraining:\n  lr=" in text and "predict_mesh" not in text,
       "train --help lists train's keys (grouped) once, not predict's", text)
expect(max(len(l) for l in text.splitlines()) <= 80, "train --help fits 80 columns", text)
rc, text = run(1, ["--help-keys"])
expect(rc == 0 and text.startswith("# Every key") and "| `predict_mesh` |" in text, "--help-keys prints every key as markdown", text)

rc, text = run(2, ["--features"])
rows = [l.split() for l in text.splitlines() if l and not l.startswith("#")]
expect(rc == 0 and text.count("# CP strategies") == 1, "--features prints its table once and exits 0", text)
expect(rows and rows[0][0] == "strategy" and len(rows) == 16 and
       {r[0] for r in rows[1:]} == {"allgather", "ulysses", "ring", "usp", "halo", "pass_q", "decode_pass_q",
                                    "decode_allgather"},
       "--features: a header and one row per registry row (15), every strategy named", text)

rc, text = run(2, ["run", "seq=8K", "--strategy=allgather", "--print-config", "out=" + out])
expect(rc == 0, "--print-config exits 0", text)
expect(len(re.findall(r"^\s*strategy\s*=", text, re.M)) == 1 and "allgather" in text and "8192" in text,
       "--print-config shows overrides once (rank 0)", text)

rc, text = run(8, ["run", "mesh=ring:4,ulysses:2", "strategy=usp", "seq=16K", "--dry-run", "out=" + out])
expect(rc == 0, "--dry-run exits 0", text)
lines = [l for l in text.splitlines() if l.strip()[:1].isdigit()]
expect(len(lines) == 8, f"--dry-run prints one line per rank (got {len(lines)})", text)
expect("ulysses:2,ring:4" in text and "memory estimate per rank" in text, "--dry-run prints mesh and memory", text)
# zigzag over P = 8: CP rank 0 holds chunks 0 and 15 of 1K tokens each
expect("[0,1024) [15360,16384)" in text, "--dry-run shows zigzag token ranges of CP rank 0", text)

# strategy=auto: the cost model's choice for this mesh, logged once with every strategy's prediction.
rc, text = run(4, ["train", "mesh=ulysses:2,ring:2", "strategy=auto", "seq=4K", "--dry-run", "out=" + out])
expect(rc == 0 and text.count("# strategy=auto") == 1 and text.count("(chosen)") == 1,
       "strategy=auto logs its choice once (rank 0)", text)
for st in ("allgather", "ulysses", "ring", "usp"):
    expect(st + " " in text.split("# strategy=auto")[1].splitlines()[0], f"strategy=auto line predicts {st}", text)

# A config file's keys the mode does not read: run, named once in a note (a file serves several modes).
cfgfile = os.path.join(tmp, "shared.toml")
with open(cfgfile, "w") as f:
    f.write('seq = 1024\nlr = 1e-3\nwarmup = 0\n')
rc, text = run(2, ["predict", "--config", cfgfile, "--dry-run", "out=" + out])
expect(rc == 0 and text.count("# note: " + cfgfile + " sets lr, warmup, which `ctxpar predict` does not read") == 1,
       "a config file's keys the mode does not read are named once", text)
rc, text = run(2, ["train", "--config", cfgfile, "--dry-run", "out=" + out])
expect(rc == 0 and "# note:" not in text, "no note when the mode reads every key of the file", text)
os.remove(cfgfile)

expect(os.listdir(tmp) == [], "no file written by --help/--print-config/--dry-run", str(os.listdir(tmp)))
print(f"{checks - len(failures)} passed, {len(failures)} failed")
sys.exit(1 if failures else 0)
