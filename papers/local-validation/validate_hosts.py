#!/usr/bin/env python3
"""Predicted vs measured across hosts: the two-level cost model (inside a host: shared memory;
between hosts: a shaped TCP link) against runs on a cluster made on this machine
(tests/cluster/cluster.sh: network namespaces with their own hostnames, veth links shaped by tc).

Per pass: `bench calibrate` on one host (np 2: compute rates) and on each layout's cluster (the
links inside and between hosts, the all-reduce across them, ranks per host, the cores the
hosts share); merged into one profile per layout. Then
training steps and full prefills for ring, allgather, ulysses and usp at 2 hosts x 2 ranks and
4 hosts x 1 rank, each run with mpirun across the hosts, the median step time / TTFT read from
the trace and compared with `ctxpar predict hardware=<that profile>`. Goal: within ±20%.

Usage: /usr/bin/python3 papers/local-validation/validate_hosts.py [--quick] [--passes=N] [--rate=1gbit]
Needs root and `ip netns` (the cluster script); writes hosts_points.csv and
hosts_predicted_vs_measured.png beside this script and prints the README table.
"""
import os
import re
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))
sys.path.insert(0, HERE)
import predict_lib as pl  # noqa: E402
from validate import ENV, MODEL, PREDICT_MODEL, PREFILL_NAME, measured_step_s, mpirun, report  # noqa: E402

CLUSTER = os.path.join(pl.ROOT, "tests", "cluster", "cluster.sh")
# (hosts, ranks per host): 2 x 2 puts two ranks on each host, 4 x 1 makes every hop cross a link.
LAYOUTS = [(2, 2), (4, 1)]
# strategy -> mesh (4 ranks, block placement: ranks 0,1 on h1 at 2 x 2); usp's Ulysses axis is the
# inner one, so at 2 x 2 it stays inside a host and the ring crosses the hosts.
MESH = {"allgather": "ring:4", "ulysses": "ring:4", "ring": "ring:4", "usp": "ulysses:2,ring:2"}


def cluster(hosts, rph, rate, args, timeout=900):
    cmd = ["bash", CLUSTER, "--hosts", str(hosts), "--ranks-per-host", str(rph), "--rate", rate, "--", pl.ctxpar_binary()] + args
    r = subprocess.run(cmd, cwd=pl.ROOT, capture_output=True, text=True, env=ENV, timeout=timeout)
    if r.returncode == 77:
        sys.exit("skipped: " + (r.stdout + r.stderr).strip())
    if r.returncode != 0:
        sys.exit("failed: %s\n%s" % (" ".join(cmd), (r.stdout + r.stderr)[-4000:]))
    return r.stdout


def read_profile(path):
    return open(path).read()


def set_key(text, key, value):
    new, n = re.subn(r"(?m)^%s = .*$" % re.escape(key), "%s = %s  # set by validate_hosts.py" % (key, value), text)
    if n != 1:
        sys.exit("profile has no single '%s' line" % key)
    return new


def profile_value(text, key):
    m = re.search(r"(?m)^%s = ([^#\n]*)" % re.escape(key), text)
    return float(m.group(1)) if m else None


def calibrate(rate, layouts=LAYOUTS, host_toml=None, model=MODEL):
    """Profiles per layout: compute rates from one host (np 2, as the one-host validation; or the
    profile host_toml already measured), the links and the cross-host all-reduce rate from
    `bench calibrate` on that layout's cluster (4 ranks on 2 cores would halve the compute rates
    the one-host profile already prices through compute_units_per_node).
    Returns {(hosts, rph): profile path}."""
    if host_toml is None:
        host_toml = "/tmp/ctxpar_hw_onehost.toml"
        print(mpirun(2, ["bench", "calibrate", "threads=1", "out=/tmp/ctxpar_cal.h5", "hardware=" + host_toml] + model), flush=True)
    base = read_profile(host_toml)
    paths = {}
    for hosts, rph in layouts:
        link_toml = "/tmp/ctxpar_hw_link_%dx%d_%s.toml" % (hosts, rph, rate)
        out = cluster(hosts, rph, rate, ["bench", "calibrate", "threads=1", "out=/tmp/ctxpar_cal_link.h5", "hardware=" + link_toml] + model)
        print("%dx%d: " % (hosts, rph) + "; ".join(" ".join(l.split()) for l in out.splitlines()
                                                    if "host to host" in l), flush=True)
        link = read_profile(link_toml)
        t = base
        keys = ["inter_gb_s", "inter_latency_us", "inter_collective_gb_s", "inter_allgather_gb_s", "inter_alltoall_gb_s",
                "inter_overlap_loss_ns_per_byte", "chips_per_node", "compute_units_per_node"]
        if rph > 1:
            keys += ["intra_gb_s", "intra_latency_us"]
        for k in keys:
            v = profile_value(link, k)
            if v is None:  # calibrate writes the fitted rates only where it measured them
                continue
            if profile_value(t, k) is None:
                t += "%s = %g  # set by validate_hosts.py\n" % (k, v)
            else:
                t = set_key(t, k, "%g" % v)
        t = set_key(t, "description", '"merged by validate_hosts.py: compute of %s (one host), links of %s (%d hosts x %d, %s)"'
                    % (host_toml, link_toml, hosts, rph, rate))
        p = "/tmp/ctxpar_hw_%dx%d_%s.toml" % (hosts, rph, rate)
        open(p, "w").write(t)
        paths[(hosts, rph)] = p
    return paths


def sweep(quick, rate):
    profiles = calibrate(rate)
    seqs = [2048] if quick else [2048, 4096]
    out = {}
    for kind in ("train", "prefill"):
        for seq in seqs:
            for hosts, rph in LAYOUTS:
                for st, mesh in MESH.items():
                    path = "/tmp/ctxpar_valh_%s_%dx%d_%s_%d.h5" % (kind, hosts, rph, st, seq)
                    common = MODEL + ["threads=1", "seq=%d" % seq, "strategy=" + st, "mesh=" + mesh, "out=" + path]
                    if kind == "train":
                        cluster(hosts, rph, rate, ["train"] + common + ["steps=5", "warmup=1"])
                        meas = measured_step_s(path)
                        model_name, mode = st, "train"
                    else:
                        cluster(hosts, rph, rate, ["prefill"] + common + ["miss_rate=1", "cp_algo=pass_kv", "steps=9", "warmup=1"])
                        meas = measured_step_s(path, "ttft_s_median")
                        model_name, mode = PREFILL_NAME[st], "prefill"
                    rows = pl.predict(PREDICT_MODEL + ["hardware=" + profiles[(hosts, rph)], "predict_mode=" + mode, "seq=%d" % seq,
                                               "predict_mesh=" + mesh])
                    pred = float(pl.row_of(rows, model_name)["time_s"])
                    pid = "%s %dx%d %s S=%d" % (kind, hosts, rph, st, seq)
                    out[pid] = (meas, pred, dict(metric="step_time" if kind == "train" else "ttft", group="%s %dx%d" % (kind, hosts, rph),
                                                 command="predict_mode=%s predict_mesh=%s seq=%d (strategy %s) hosts x ranks %dx%d"
                                                 % (mode, mesh, seq, model_name, hosts, rph)))
                    print("%-30s measured %.4f s predicted %.4f s error %+.1f%%" % (pid, meas, pred, pl.error_pct(pred, meas)), flush=True)
    return out


def main():
    quick = "--quick" in sys.argv
    passes = 1 if quick else 2
    rate = "1gbit"
    for a in sys.argv[1:]:
        if a.startswith("--passes="):
            passes = int(a.split("=", 1)[1])
        elif a.startswith("--rate="):
            rate = a.split("=", 1)[1]
    runs = []
    for i in range(passes):
        print("# pass %d of %d (host-to-host links %s)" % (i + 1, passes, rate), flush=True)
        runs.append(sweep(quick, rate))
    report(runs, "hosts_points.csv", "hosts_predicted_vs_measured.png",
           "ctxpar across hosts (links %s): predicted vs measured" % rate)

if __name__ == "__main__":
    main()
