#!/usr/bin/env bash
# End-to-end test of jobs/ under a real single-node SLURM (shared/SLURM.md): starts munged,
# slurmctld and slurmd of its own (private sockets, ports, spool, logs in the work directory),
# submits a 4-rank job (srun --mpi=pmix), a 2-rank job (mpirun variant), a 2-run sweep
# (jobs/sweep.py --submit, a job each) and a 2-run sweep as a job array, and a long job that is
# sent USR1 as --signal=B:USR1@120 would; checks every run directory and trace with the loader;
# stops the daemons it started (by PID) however it ends.
#
#   tests/slurm/run_slurm_test.sh [--ctxpar build/ctxpar] [--workdir DIR] [--install | --install-only]
#
# Exit codes: 0 pass, 1 fail, 77 skipped (no SLURM installed, or not root: ctest SKIP_RETURN_CODE).
# --install (or CTXPAR_SLURM_INSTALL=1 in the environment) installs Debian's slurmctld, slurmd,
# slurm-client and munge when missing (root, apt-get): CI does that; a developer machine without
# SLURM skips. --install-only installs and exits.
set -euo pipefail

REPO=$(cd "$(dirname "$0")/../.." && pwd)
CTXPAR=$REPO/build/ctxpar
WORK=
INSTALL=${CTXPAR_SLURM_INSTALL:-0}
INSTALL_ONLY=0
while [ $# -gt 0 ]; do
  case "$1" in
    --ctxpar) CTXPAR=$(realpath "$2"); shift 2 ;;
    --workdir) WORK=$2; shift 2 ;;
    --install) INSTALL=1; shift ;;
    --install-only) INSTALL=1; INSTALL_ONLY=1; shift ;;
    *) echo "run_slurm_test.sh: unknown argument '$1'" >&2; exit 2 ;;
  esac
done
PY=/usr/bin/python3
PACKAGES=(slurmctld slurmd slurm-client munge)

have_slurm() { [ -x /usr/sbin/slurmctld ] && [ -x /usr/sbin/slurmd ] && [ -x /usr/sbin/munged ] && command -v sbatch >/dev/null; }

if ! have_slurm; then
  if [ "$INSTALL" = 1 ]; then
    [ "$(id -u)" = 0 ] || { echo "run_slurm_test.sh: installing SLURM needs root" >&2; exit 1; }
    echo "# installing ${PACKAGES[*]} (Debian packages; nothing is started at install)"
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" >/dev/null \
      || { apt-get update >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "${PACKAGES[@]}" >/dev/null; }
  else
    echo "SKIP: SLURM is not installed (no /usr/sbin/slurmctld). CI installs it with"
    echo "      'bash tests/slurm/run_slurm_test.sh --install-only'; to run this test here as root:"
    echo "      apt-get install ${PACKAGES[*]}"
    exit 77
  fi
fi
[ "$INSTALL_ONLY" = 1 ] && { echo "# SLURM installed"; exit 0; }
if [ "$(id -u)" != 0 ]; then
  echo "SKIP: this test starts slurmd, which must run as root (SlurmdUser=root)"
  exit 77
fi
[ -x "$CTXPAR" ] || { echo "run_slurm_test.sh: no executable $CTXPAR (--ctxpar PATH)" >&2; exit 1; }

WORK=${WORK:-$(mktemp -d /tmp/ctxpar-slurm.XXXXXX)}
rm -rf "$WORK"; mkdir -p "$WORK"; WORK=$(realpath "$WORK")
S=$WORK/slurm            # daemons' state, sockets, logs
mkdir -p "$S/munge" "$S/slurmd" "$S/slurmctld" "$S/log"
chown munge:munge "$S/munge"; chmod 755 "$S/munge"   # munged wants the socket dir searchable by all

MUNGE_PID='' CTLD_PID='' SLURMD_PID=''
log() { echo "# $(date +%T) $*"; }

stop_pid() {  # stop_pid PID NAME: TERM, up to 15 s, then KILL — only the processes started here
  local pid=$1 name=$2
  [ -n "$pid" ] || return 0
  kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 150); do kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null || true; return 0; }; sleep 0.1; done
  echo "# $name (pid $pid) did not stop on TERM: KILL" >&2
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}

cleanup() {
  local rc=$?
  set +e
  if [ -n "$CTLD_PID" ] && kill -0 "$CTLD_PID" 2>/dev/null; then
    # Jobs still in our private cluster (a failed check): cancel, and give their steps time to end.
    mapfile -t ids < <(squeue -h -o %i 2>/dev/null)
    if [ ${#ids[@]} -gt 0 ]; then
      scancel "${ids[@]}" 2>/dev/null
      for _ in $(seq 60); do [ -z "$(squeue -h -o %i 2>/dev/null)" ] && break; sleep 0.5; done
    fi
  fi
  stop_pid "$SLURMD_PID" slurmd
  stop_pid "$CTLD_PID" slurmctld
  stop_pid "$MUNGE_PID" munged
  if [ $rc -ne 0 ] && [ $rc -ne 77 ]; then
    echo "---- FAILED (exit $rc); daemon logs under $S/log; their tails:"
    for f in "$S"/log/*.log; do [ -f "$f" ] && { echo "== $f"; tail -n 15 "$f"; }; done
  fi
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# ---- munge: its own socket, key from the package ----------------------------------------------
MUNGE_SOCKET=$S/munge/munge.socket
# setpriv execs munged directly (no forking wrapper), so $! is munged itself.
setpriv --reuid=munge --regid=munge --init-groups /usr/sbin/munged -F --socket="$MUNGE_SOCKET" \
  --pid-file="$S/munge/munged.pid" --log-file="$S/munge/munged.log" --seed-file="$S/munge/munged.seed" \
  > "$S/log/munged.stdout.log" 2>&1 &
MUNGE_PID=$!
for _ in $(seq 50); do [ -S "$MUNGE_SOCKET" ] && break; sleep 0.1; done
munge -S "$MUNGE_SOCKET" -n | unmunge -S "$MUNGE_SOCKET" | grep -q 'STATUS: *Success' \
  || { echo "munge does not work"; cp "$S/munge/munged.log" "$S/log/munged.log" 2>/dev/null; exit 1; }
log "munged pid $MUNGE_PID"

# ---- slurm.conf (shared/SLURM.md), private ports and paths ------------------------------------
free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
HOST=$(hostname -s)
CTLD_PORT=$(free_port); SLURMD_PORT=$(free_port)
while [ "$SLURMD_PORT" = "$CTLD_PORT" ]; do SLURMD_PORT=$(free_port); done
export SLURM_CONF=$S/slurm.conf
cat > "$SLURM_CONF" <<EOF
ClusterName=ctxpartest
SlurmctldHost=$HOST(127.0.0.1)
SlurmctldPort=$CTLD_PORT
SlurmdPort=$SLURMD_PORT
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
AuthInfo=socket=$MUNGE_SOCKET
MpiDefault=pmix
ProctrackType=proctrack/linuxproc
TaskPlugin=task/affinity
ReturnToService=2
SlurmctldPidFile=$S/slurmctld.pid
SlurmdPidFile=$S/slurmd.pid
SlurmdSpoolDir=$S/slurmd
StateSaveLocation=$S/slurmctld
SlurmctldLogFile=$S/log/slurmctld.log
SlurmdLogFile=$S/log/slurmd.log
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
JobCompType=jobcomp/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SlurmdParameters=config_overrides
NodeName=$HOST NodeAddr=127.0.0.1 CPUs=8 Boards=1 SocketsPerBoard=1 CoresPerSocket=8 ThreadsPerCore=1 RealMemory=8000 State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
EOF

/usr/sbin/slurmctld -D -i -f "$SLURM_CONF" > "$S/log/slurmctld.stdout.log" 2>&1 &
CTLD_PID=$!
/usr/sbin/slurmd -D -f "$SLURM_CONF" -N "$HOST" > "$S/log/slurmd.stdout.log" 2>&1 &
SLURMD_PID=$!
for _ in $(seq 120); do
  state=$(sinfo -h -n "$HOST" -o %t 2>/dev/null || true)
  [ "$state" = idle ] && break
  kill -0 "$CTLD_PID" 2>/dev/null || { echo "slurmctld exited"; exit 1; }
  kill -0 "$SLURMD_PID" 2>/dev/null || { echo "slurmd exited"; exit 1; }
  sleep 0.5
done
[ "$state" = idle ] || { echo "node $HOST not idle after 60 s (state '$state')"; exit 1; }
log "slurmctld pid $CTLD_PID, slurmd pid $SLURMD_PID; node $HOST idle"

# ---- jobs ---------------------------------------------------------------------------------------
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 OMP_NUM_THREADS=1
# Tiny runs: the point is the job machinery, not performance (2 cores here).
SMALL=(seq=1K heads=4 kv_heads=4 head_dim=32 steps=2 warmup=1 bench_max_bytes=4K bench_iters=1)
J=$WORK/jobs
mkdir -p "$J"
cd "$REPO"   # sbatch's submit directory = the repository (the scripts' default CTXPAR_REPO)
submit() {   # submit RUN_DIR SBATCH_ARGS... -- SCRIPT CTXPAR_ARGS...: prints the job id
  local dir=$1; shift
  local sb=()
  while [ "$1" != -- ]; do sb+=("$1"); shift; done; shift
  mkdir -p "$dir"
  sbatch --parsable -o "$dir/slurm.out" "${sb[@]}" \
    --export="ALL,CTXPAR_RUN_DIR=$dir,CTXPAR_BIN=$CTXPAR" "$@" | cut -d';' -f1
}
JOB_SRUN=$(submit "$J/srun4" -n 4 -- jobs/ctxpar.sbatch run strategy=ring "${SMALL[@]}")
JOB_MPIRUN=$(submit "$J/mpirun2" -n 2 -- jobs/ctxpar-mpirun.sbatch run strategy=allgather "${SMALL[@]}")
# A long run that the test stops with USR1 to the batch shell: what --signal=B:USR1@120 delivers.
JOB_USR1=$(submit "$J/usr1" -n 2 -- jobs/ctxpar.sbatch run strategy=ring "${SMALL[@]}" steps=100000)
# The plain use: no run directory named, submitted from elsewhere with CTXPAR_REPO set: the run
# goes to runs/<job id>/ and SLURM's output to ctxpar-<job id>.out, both in the submit directory.
mkdir -p "$J/plain"
JOB_PLAIN=$(cd "$J/plain" && CTXPAR_REPO=$REPO CTXPAR_BIN=$CTXPAR sbatch --parsable -n 2 "$REPO/jobs/ctxpar.sbatch" \
  run strategy=ring "${SMALL[@]}" | cut -d';' -f1)
log "submitted srun job $JOB_SRUN, mpirun job $JOB_MPIRUN, USR1 job $JOB_USR1, plain job $JOB_PLAIN"
"$PY" jobs/sweep.py --submit --array --nodes 1 --ranks-per-node 2 --strategies ring --seq 512,1K \
  --ctxpar "$CTXPAR" --out "$J/sweep_array" -- heads=4 kv_heads=4 head_dim=32 steps=2 bench_max_bytes=4K bench_iters=1

# USR1: once the long run has flushed 3 steps, signal its batch shell only (-b), as SLURM does.
deadline=$((SECONDS + 240))
until "$PY" "$REPO/tests/slurm/check_runs.py" --min-flushed 3 "$J/usr1" >/dev/null 2>&1; do
  [ $SECONDS -lt $deadline ] || { echo "the USR1 job flushed no 3 steps in 240 s"; scontrol show job "$JOB_USR1"; exit 1; }
  state=$(squeue -h -j "$JOB_USR1" -o %T 2>/dev/null || true)
  [ -n "$state" ] || { echo "the USR1 job ended before it was signalled"; cat "$J/usr1/job.out"; exit 1; }
  sleep 1
done
scancel --batch --signal=USR1 "$JOB_USR1"
log "sent USR1 to the batch shell of job $JOB_USR1"
# A sweep that waits for its own jobs (sweep.py --wait: exit code 0 only when every run ended 0).
"$PY" jobs/sweep.py --submit --wait --wait-timeout 400 --nodes 1 --ranks-per-node 2 --strategies ring,allgather \
  --seq 1K --ctxpar "$CTXPAR" --out "$J/sweep" -- heads=4 kv_heads=4 head_dim=32 steps=2 bench_max_bytes=4K bench_iters=1

deadline=$((SECONDS + 420))
while [ -n "$(squeue -h -o %i)" ]; do
  [ $SECONDS -lt $deadline ] || { echo "jobs still in the queue after 420 s:"; squeue; exit 1; }
  sleep 1
done
log "all jobs ended"

# ---- checks (with the one trace loader) -------------------------------------------------------
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 4 --steps 3 --launcher srun --slurm "$J/srun4"
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --steps 3 --launcher mpirun --slurm "$J/mpirun2"
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --steps 3 --launcher srun --slurm --sweep 2 "$J/sweep"
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --steps 3 --launcher srun --slurm --sweep 2 "$J/sweep_array"
# A run stopped by a signal exits 128 + its number (ctxpar's exit codes; SIGUSR1 = 10).
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --status truncated --exit-code 138 --launcher srun --slurm "$J/usr1"
[ -f "$J/plain/ctxpar-$JOB_PLAIN.out" ] || { echo "no $J/plain/ctxpar-$JOB_PLAIN.out (default --output)"; exit 1; }
"$PY" "$REPO/tests/slurm/check_runs.py" --ranks 2 --steps 3 --launcher srun --slurm "$J/plain/runs/$JOB_PLAIN"
echo "PASS: SLURM jobs, sweeps, job array and USR1 flush"
