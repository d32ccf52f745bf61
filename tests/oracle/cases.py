"""A group of oracle cases in one interpreter (PyTorch is imported once per group, not per case).

Command line of an oracle script:  SCRIPT CTXPAR MPIRUN [--flag ...] --case NAME NP CONFIG [key=value ...]
[--case ...]. Each case runs on NP ranks with the configuration CONFIG and its settings; one case
alone reproduces a failure (e.g. `--case gdn_np4_usp 4 inputs/tiny.toml layer_pattern=DG ...`)."""
import sys
import time


def parse(argv):
    """(ctxpar, mpirun, flags, [(name, np, config, settings)]) from argv[1:]."""
    ctxpar, mpirun, rest = argv[1], argv[2], argv[3:]
    flags = []
    while rest and rest[0] != "--case":
        flags.append(rest.pop(0))
    cases = []
    while rest:
        assert rest.pop(0) == "--case"
        name, np_, config = rest[0], rest[1], rest[2]
        rest = rest[3:]
        settings = []
        while rest and rest[0] != "--case":
            settings.append(rest.pop(0))
        cases.append((name, np_, config, settings))
    if not cases:
        raise SystemExit(f"usage: {argv[0]} CTXPAR MPIRUN [flags] --case NAME NP CONFIG [key=value ...] ...")
    return ctxpar, mpirun, flags, cases


def run_all(argv, run_case):
    """Runs run_case(ctxpar, mpirun, flags, np, config, settings) -> 0/1 for every case; 1 if any failed."""
    ctxpar, mpirun, flags, cases = parse(argv)
    failed = []
    for name, np_, config, settings in cases:
        print(f"==== case {name}: {np_} ranks, {config} {' '.join(settings)}", flush=True)
        t0 = time.time()
        rc = run_case(ctxpar, mpirun, flags, np_, config, settings)
        print(f"==== case {name}: {'PASS' if rc == 0 else 'FAIL'} ({time.time() - t0:.1f} s)", flush=True)
        if rc != 0:
            failed.append(name)
    print(f"{len(cases) - len(failed)} of {len(cases)} cases passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
