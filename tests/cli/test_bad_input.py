#!/usr/bin/env python3
"""Bad-input table: each case must print one clear message on rank 0 that names the field,
exit with code 2 on every rank, finish within 30 s and leave no output file behind.
Usage: test_bad_input.py CTXPAR_BINARY [--table]  (--table prints the cases and their messages)"""
import os
import shutil
import subprocess
import sys
import tempfile
import time

NP = 2
TIMEOUT_S = 30

# (name, extra args, text the message must contain)
CASES = [
    ("unknown key", ["run", "sequ=4K"], "sequ"),
    ("not an integer", ["run", "seq=abc"], "seq"),
    ("bad size suffix", ["run", "seq=12Q"], "seq"),
    ("out of range", ["run", "head_dim=512"], "head_dim"),
    ("unknown strategy", ["run", "strategy=spiral"], "strategy"),
    ("bad boolean", ["bench", "comm", "csv=maybe"], "csv"),
    ("bad float", ["run", "watchdog_s=fast"], "watchdog_s"),
    ("mesh product != ranks", ["run", "mesh=ring:3"], "mesh"),
    ("unknown mesh axis", ["run", "mesh=torus:2"], "mesh"),
    ("heads not a multiple of kv_heads", ["run", "heads=6", "kv_heads=4"], "kv_heads"),
    ("window without mask=window", ["run", "window=64"], "window"),
    ("mask=window without window", ["run", "mask=window"], "window"),
    ("seq not divisible for zigzag", ["run", "seq=1001"], "seq"),
    ("document lengths do not sum to seq", ["run", "seq=4K", "docs=100,200"], "docs"),
    ("ulysses cannot split heads", ["run", "strategy=ulysses", "mesh=ulysses:2", "heads=3", "kv_heads=3"], "heads"),
    ("strategy=auto without a readable profile", ["train", "strategy=auto", "hardware=nope"], "hardware"),
    ("device=cuda for a mode not built for it", ["train", "device=cuda"], "device"),
    ("unknown mode", ["fly"], "mode"),
    ("unknown bench", ["bench", "warp"], "bench"),
    ("missing --config file", ["run", "--config", "does/not/exist.toml"], "config"),
    ("TOML syntax error", ["run", "--config", "@BADTOML@"], "bad.toml"),
    ("unknown key in TOML", ["run", "--config", "@UNKNOWNTOML@"], "colour"),
    ("out is a directory", ["run", "out=@TMP@"], "out"),
    ("attn input file missing", ["attn", "in=@TMP@/missing.h5", "out=@TMP@/res.h5"], "in"),
]


def main():
    binary = sys.argv[1]
    show = "--table" in sys.argv
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1", OMP_NUM_THREADS="1")
    failures = []
    rows = []
    for name, args, must in CASES:
        tmp = tempfile.mkdtemp(prefix="ctxpar-bad-")
        with open(os.path.join(tmp, "bad.toml"), "w") as f:
            f.write("seq = \n")
        with open(os.path.join(tmp, "unknown.toml"), "w") as f:
            f.write("colour = \"red\"\n")
        args = [a.replace("@BADTOML@", os.path.join(tmp, "bad.toml"))
                 .replace("@UNKNOWNTOML@", os.path.join(tmp, "unknown.toml"))
                 .replace("@TMP@", tmp) for a in args]
        out = os.path.join(tmp, "o", "run.h5")
        if not any(a.startswith("out=") for a in args):
            args = args + ["out=" + out]
        before = set(os.listdir(tmp))
        cmd = ["mpirun", "-np", str(NP), "--oversubscribe", "--bind-to", "none", binary] + args
        t0 = time.time()
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
            rc, text = p.returncode, p.stdout + p.stderr
        except subprocess.TimeoutExpired:
            rc, text = None, "(timed out)"
        dt = time.time() - t0
        after = set(os.listdir(tmp))
        created = sorted(after - before)
        msg_lines = [l for l in text.splitlines() if l.startswith("ctxpar: error:")]
        problems = []
        if rc != 2:
            problems.append(f"exit code {rc}, expected 2")
        if must not in text:
            problems.append(f"message does not name '{must}'")
        if len(msg_lines) != 1:
            problems.append(f"{len(msg_lines)} error lines, expected exactly 1 (rank 0 only)")
        if created:
            problems.append(f"left files behind: {created}")
        if dt > TIMEOUT_S:
            problems.append(f"took {dt:.1f} s")
        rows.append((name, " ".join(args), rc, f"{dt:.1f}", msg_lines[0] if msg_lines else text.strip()[:200]))
        if problems:
            failures.append((name, problems, text))
        shutil.rmtree(tmp, ignore_errors=True)
    if show:
        print("| case | arguments | exit | s | message |")
        print("|---|---|---|---|---|")
        for r in rows:
            print("| " + " | ".join(str(x).replace("|", "\\|") for x in r) + " |")
    for name, problems, text in failures:
        print(f"FAIL {name}: {'; '.join(problems)}\n---\n{text}\n---")
    print(f"{len(CASES) - len(failures)} passed, {len(failures)} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
