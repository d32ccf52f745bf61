"""Shared helpers of the paper reproductions: run `ctxpar predict` for one point and read its CSV
row; compare with a published value; write the points CSV, the figure and the README table."""
import csv
import io
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def ctxpar_binary():
    """The ctxpar binary: $CTXPAR, else the first build directory that has one."""
    if os.environ.get("CTXPAR"):
        return os.environ["CTXPAR"]
    for d in ("build", "build-perf"):
        p = os.path.join(ROOT, d, "ctxpar")
        if os.path.exists(p):
            h = subprocess.run([p, "--help"], capture_output=True, text=True,
                               env=dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1"))
            if "predict" in h.stdout:  # a build that has the cost model
                return p
    sys.exit("ctxpar binary not found: build it (make) or set CTXPAR=/path/to/ctxpar")


def predict(args):
    """Runs `ctxpar predict ARGS --csv` (one rank, no MPI launcher needed) and returns the rows."""
    env = dict(os.environ, OMPI_ALLOW_RUN_AS_ROOT="1", OMPI_ALLOW_RUN_AS_ROOT_CONFIRM="1")
    cmd = [ctxpar_binary(), "predict", "--csv", "out=/tmp/ctxpar_predict_paper.h5"] + args
    r = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit("ctxpar predict failed (%d): %s\n%s" % (r.returncode, " ".join(cmd), r.stdout + r.stderr))
    return list(csv.DictReader(io.StringIO(r.stdout)))


def row_of(rows, strategy):
    for r in rows:
        if r["strategy"] == strategy:
            return r
    sys.exit("no row for strategy %s" % strategy)


def error_pct(pred, pub):
    return 100.0 * (pred - pub) / pub


def write_outputs(folder, points, tol_pct, title, ylabel, reference="published"):
    """points: dicts with id, published, predicted, unit, command, within (bool or None = not a goal).
    `reference` names what the predictions are compared with (published, or measured here): the
    CSV column and the figure's axis say it."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    with open(os.path.join(folder, "points.csv"), "w", newline="") as f:
        w = csv.writer(f)
        w.writerow(["point", "metric", "unit", reference, "predicted", "error_pct", "within_tolerance", "ctxpar_predict_args"])
        for p in points:
            w.writerow([p["id"], p["metric"], p["unit"], p["published"], "%.6g" % p["predicted"],
                        "%.1f" % error_pct(p["predicted"], p["published"]),
                        "" if p["within"] is None else ("yes" if p["within"] else "no"), p["command"]])
    # One axis unit: everything in seconds (points may be given in s or ms).
    scale = {"s": 1.0, "ms": 1e-3, "us": 1e-6}
    points = [dict(p, published=p["published"] * scale.get(p["unit"], 1.0), predicted=p["predicted"] * scale.get(p["unit"], 1.0))
              for p in points]
    fig, ax = plt.subplots(figsize=(7, 6))
    lo = min(min(p["published"], p["predicted"]) for p in points) * 0.7
    hi = max(max(p["published"], p["predicted"]) for p in points) * 1.4
    ax.plot([lo, hi], [lo, hi], "k-", lw=0.8, label="predicted = " + reference)
    ax.fill_between([lo, hi], [lo * (1 - tol_pct / 100)] * 1 + [hi * (1 - tol_pct / 100)],
                    [lo * (1 + tol_pct / 100), hi * (1 + tol_pct / 100)], color="0.9", label="±%d%%" % tol_pct)
    groups = sorted(set(p["group"] for p in points))
    for g in groups:
        xs = [p["published"] for p in points if p["group"] == g]
        ys = [p["predicted"] for p in points if p["group"] == g]
        ax.scatter(xs, ys, s=22, label=g)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(lo, hi)
    ax.set_ylim(lo, hi)
    ax.set_xlabel(reference + " " + ylabel + " [s]")
    ax.set_ylabel("predicted (ctxpar predict) " + ylabel + " [s]")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7, loc="upper left")
    fig.tight_layout()
    fig.savefig(os.path.join(folder, "predicted_vs_published.png"), dpi=120)


def markdown_table(points):
    out = ["| point | metric | published | predicted | error | within goal |", "|---|---|---|---|---|---|"]
    for p in points:
        goal = "—" if p["within"] is None else ("yes" if p["within"] else "**no**")
        out.append("| %s | %s | %g %s | %.4g %s | %+.1f%% | %s |" % (p["id"], p["metric"], p["published"], p["unit"],
                                                               p["predicted"], p["unit"],
                                                               error_pct(p["predicted"], p["published"]), goal))
    return "\n".join(out)
