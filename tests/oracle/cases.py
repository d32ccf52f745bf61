"""A group of oracle cases in one interpreter (PyTorch is imported once per group, not per case).

Command line of an oracle script:  SCRIPT CTXPAR MPIRUN [--flag ...] --case NAME NP CONFIG [key=value ...]
[--case ...]. Each case runs on NP ranks with the configuration CONFIG and its settings; one case
alone reproduces a failure (e.g. `--case gdn_np4_usp 4 inputs/tiny.toml layer_pattern=DG ...`)."""
import io
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

# Cases run this many at a time (one's PyTorch reference beside the next one's ctxpar job), each
# printing into its own buffer; the buffers are printed whole, in the cases' order.
PARALLEL = 2


class _PerThreadStdout:
    """sys.stdout while cases run side by side: a thread that has a buffer writes there."""

    def __init__(self, real):
        self.real = real
        self.local = threading.local()

    def _out(self):
        buf = getattr(self.local, "buf", None)
        return self.real if buf is None else buf

    def write(self, s):
        return self._out().write(s)

    def flush(self):
        self._out().flush()


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
    """Runs run_case(ctxpar, mpirun, flags, np, config, settings) -> 0/1 for every case, PARALLEL at
    a time, each case's output printed whole and in order; 1 if any failed."""
    ctxpar, mpirun, flags, cases = parse(argv)
    real = sys.stdout
    proxy = _PerThreadStdout(real)

    def one(case):
        name, np_, config, settings = case
        proxy.local.buf = io.StringIO()
        t0 = time.time()
        try:
            rc = run_case(ctxpar, mpirun, flags, np_, config, settings)
        except Exception:  # noqa: BLE001 -- a crash of one case fails it and is shown with its output
            traceback.print_exc(file=proxy.local.buf)
            rc = 1
        text, proxy.local.buf = proxy.local.buf.getvalue(), None
        return rc, time.time() - t0, text

    failed = []
    sys.stdout = proxy
    try:
        with ThreadPoolExecutor(PARALLEL) as ex:
            futures = [ex.submit(one, c) for c in cases]
            for (name, np_, config, settings), fut in zip(cases, futures):
                rc, seconds, text = fut.result()
                real.write(f"==== case {name}: {np_} ranks, {config} {' '.join(settings)}\n{text}")
                real.write(f"==== case {name}: {'PASS' if rc == 0 else 'FAIL'} ({seconds:.1f} s)\n")
                real.flush()
                if rc != 0:
                    failed.append(name)
    finally:
        sys.stdout = real
    print(f"{len(cases) - len(failed)} of {len(cases)} cases passed" + (f"; failed: {', '.join(failed)}" if failed else ""))
    return 1 if failed else 0
