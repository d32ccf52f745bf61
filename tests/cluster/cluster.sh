#!/usr/bin/env bash
# A cluster on this machine: N hosts as network namespaces, each with its own hostname (a UTS
# namespace) and address, joined by veth pairs to a bridge, the links shaped with tc; a command
# run with mpirun across them; everything torn down on exit, on failure and on a signal alike.
# Ranks on one host share memory; ranks on different hosts talk TCP over the shaped link.
#
#   tests/cluster/cluster.sh [--hosts N] [--ranks-per-host K] [--rate RATE] [--delay DELAY]
#                            [--keep] -- PROGRAM [ARGS...]
#
#   --hosts N           hosts (network namespaces), default 2
#   --ranks-per-host K  MPI ranks per host, default 2 (ranks 0..K-1 on h1, K..2K-1 on h2, ...)
#   --rate RATE         each host's link, both directions (tc syntax: 1gbit, 200mbit), default
#                       1gbit: clearly slower than shared memory inside a host
#   --delay DELAY       one-way delay per link (tc syntax: 1ms), default none; needs the netem
#                       qdisc, which some kernels lack: then this stops with a message
#   --keep              print the commands to enter the hosts and wait (Ctrl-C tears down)
#   --fault KIND:I@T    T seconds after the start, host I fails: KIND link-down (its link to the
#                       bridge is set down) or kill (every process of the host gets SIGKILL)
#
# Prints `cluster: ...` lines on stderr; exits with the command's status, 77 (the ctest skip
# code) where this machine cannot make hosts (not root, no `ip netns`, no `unshare`), 2 on bad
# arguments. Needs root. The addresses (10.203.X.0/24, X from the process id) and names
# (cpNNNNhI) are private to this run, so several runs can coexist.
#
# mpirun runs here (in the machine's own namespace, reaching the hosts through the bridge) and
# starts its daemons in the hosts through an rsh agent that enters the host's namespaces; the
# program is run as `mpirun -np N*K --host ... PROGRAM ARGS` with the TCP interfaces pinned to
# the cluster's subnet, so the traffic between hosts takes the shaped links.
set -euo pipefail

HOSTS=2
RPH=2
RATE=1gbit
DELAY=
KEEP=0
FAULT=
usage() { sed -n '2,22p' "$0" | sed 's/^# \{0,1\}//' >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --hosts) HOSTS=${2:?}; shift 2 ;;
    --ranks-per-host) RPH=${2:?}; shift 2 ;;
    --rate) RATE=${2:?}; shift 2 ;;
    --delay) DELAY=${2:?}; shift 2 ;;
    --keep) KEEP=1; shift ;;
    --fault) FAULT=${2:?}; shift 2 ;;
    --) shift; break ;;
    -h|--help) usage ;;
    *) echo "cluster: unknown argument '$1' (valid: --hosts, --ranks-per-host, --rate, --delay, --keep, --fault, -- PROGRAM)" >&2; exit 2 ;;
  esac
done
[[ "$HOSTS" =~ ^[0-9]+$ && "$HOSTS" -ge 1 && "$HOSTS" -le 8 ]] || { echo "cluster: --hosts $HOSTS: valid 1..8" >&2; exit 2; }
[[ "$RPH" =~ ^[0-9]+$ && "$RPH" -ge 1 && "$RPH" -le 64 ]] || { echo "cluster: --ranks-per-host $RPH: valid 1..64" >&2; exit 2; }
if [ -n "$FAULT" ]; then
  [[ "$FAULT" =~ ^(link-down|kill):([0-9]+)@([0-9]+(\.[0-9]+)?)$ ]] && [ "${BASH_REMATCH[2]}" -ge 1 ] &&
    [ "${BASH_REMATCH[2]}" -le "$HOSTS" ] ||
    { echo "cluster: --fault $FAULT: valid KIND:I@SECONDS with KIND link-down or kill, I in 1..$HOSTS" >&2; exit 2; }
  FAULT_KIND=${BASH_REMATCH[1]} FAULT_HOST=${BASH_REMATCH[2]} FAULT_AT=${BASH_REMATCH[3]}
fi
[ $# -gt 0 ] || [ "$KEEP" = 1 ] || { echo "cluster: no program given (after --)" >&2; exit 2; }

skip() { echo "cluster: skipped: $*" >&2; exit 77; }
[ "$(id -u)" = 0 ] || skip "needs root (network namespaces)"
command -v ip >/dev/null || skip "no 'ip' command (iproute2)"
command -v unshare >/dev/null || skip "no 'unshare' (util-linux)"
command -v tc >/dev/null || skip "no 'tc' (iproute2)"
command -v mpirun >/dev/null || skip "no mpirun"

ID=$(( $$ % 10000 ))
NET=10.203.$(( $$ % 250 ))
BR=cpb$ID
TMP=$(mktemp -d /tmp/ctxpar-cluster.XXXXXX)
ns() { echo "cp${ID}h$1"; }

teardown() {
  local rc=$?
  trap - EXIT INT TERM
  [ -z "${FAULT_PID:-}" ] || kill "$FAULT_PID" 2>/dev/null || true
  [ -z "$(jobs -p)" ] || kill $(jobs -p) 2>/dev/null || true  # --keep's sleep
  # Processes keep a deleted namespace alive (an MPI daemon cut off by a link fault would
  # outlive the run): kill what still runs in each host first.
  for i in $(seq 1 "$HOSTS"); do
    ip netns pids "$(ns "$i")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    ip netns del "$(ns "$i")" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
  rm -rf "$TMP"
  exit "$rc"
}
trap teardown EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ip netns add "cp${ID}probe" 2>/dev/null || skip "cannot create network namespaces here"
ip netns del "cp${ID}probe"

ip link add "$BR" type bridge
ip addr add "$NET.254/24" dev "$BR"
ip link set "$BR" up
# shape: the qdisc for one side of a host's link (tbf for the rate; netem for a delay)
shape() {  # shape NETNS_ARGS... DEV
  local dev=${*: -1}
  local pre=("${@:1:$#-1}")
  if [ -n "$DELAY" ]; then
    "${pre[@]}" tc qdisc add dev "$dev" root netem delay "$DELAY" rate "$RATE" 2>"$TMP/tc.err" || {
      echo "cluster: --delay $DELAY: this kernel has no netem qdisc ($(head -1 "$TMP/tc.err")); run without --delay" >&2
      exit 2
    }
  else
    # burst: one 64 KiB GSO segment, no more: a larger bucket lets every message that follows an
    # idle spell (a ring step after its compute) through at memory speed up to the bucket size, which
    # no real NIC does (256 KiB doubled the apparent rate of 512 KiB ring messages); latency bounds
    # the queue
    "${pre[@]}" tc qdisc add dev "$dev" root tbf rate "$RATE" burst 64kb latency 50ms
  fi
}
hostlist=()
for i in $(seq 1 "$HOSTS"); do
  n=$(ns "$i")
  ip netns add "$n"
  ip link add "cpv${ID}x$i" type veth peer name eth0 netns "$n"
  ip link set "cpv${ID}x$i" master "$BR" up
  ip -n "$n" addr add "$NET.$i/24" dev eth0
  ip -n "$n" link set eth0 up
  ip -n "$n" link set lo up
  shape ip netns exec "$n" eth0        # host -> bridge
  shape "cpv${ID}x$i"                  # bridge -> host
  hostlist+=("$NET.$i:$RPH")
done

# The rsh agent: `rsh [options] HOST COMMAND...` runs COMMAND in HOST's namespaces as host hI.
cat >"$TMP/rsh" <<EOF
#!/bin/bash
while [[ "\$1" == -* ]]; do shift; done
host=\$1; shift
i=\${host##*.}
exec ip netns exec cp${ID}h\$i unshare --uts /bin/sh -c "hostname h\$i; \$*"
EOF
chmod +x "$TMP/rsh"

echo "cluster: $HOSTS host(s) h1..h$HOSTS ($NET.1..$NET.$HOSTS), $RPH rank(s) each, links $RATE${DELAY:+, delay $DELAY} each way" >&2
if [ "$KEEP" = 1 ]; then
  for i in $(seq 1 "$HOSTS"); do echo "cluster: enter h$i: ip netns exec $(ns "$i") bash" >&2; done
  echo "cluster: mpirun --mca plm_rsh_agent $TMP/rsh --mca oob_tcp_if_include $NET.0/24 --mca btl_tcp_if_include $NET.0/24 --host $(IFS=,; echo "${hostlist[*]}") ..." >&2
  echo "cluster: waiting; Ctrl-C tears the hosts down" >&2
  # wait on a background sleep: a trap runs at once (a foreground sleep would hold a SIGTERM back)
  while true; do sleep 3600 & wait $!; done
fi

if [ -n "$FAULT" ]; then
  (
    sleep "$FAULT_AT"
    if [ "$FAULT_KIND" = link-down ]; then
      echo "cluster: fault at ${FAULT_AT}s: the link of h$FAULT_HOST goes down" >&2
      ip link set "cpv${ID}x$FAULT_HOST" down 2>/dev/null || true
    else
      echo "cluster: fault at ${FAULT_AT}s: every process of h$FAULT_HOST killed" >&2
      ip netns pids "$(ns "$FAULT_HOST")" 2>/dev/null | xargs -r kill -9 2>/dev/null || true
    fi
  ) &
  FAULT_PID=$!
fi
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# All hosts share this machine's cores: with more ranks than cores, ranks waiting in MPI must
# yield, or they take the cores of the ranks they wait for (mpirun cannot see this: every host
# says it has --ranks-per-host slots).
yield=()
[ $(( HOSTS * RPH )) -le "$(nproc)" ] || yield=(--mca mpi_yield_when_idle 1)
set +e
# TCP keepalive on mpirun's connections to its daemons: a daemon cut off by a link fault is
# declared lost after ~10 s of silence instead of OpenMPI's default 8 minutes. When mpirun ends
# a job it sends SIGTERM and then SIGKILL, each after odls_base_sigkill_timeout seconds (default
# 1): the ranks need that time to mark their trace. 3 s were too few once under `make test`'s full
# load on a 2-core machine (the kill fault's trace kept status running, 2026-12-07); 5 s give more
# margin while a job still ends within test_cluster.py's 30 s after a fault (the link-down fault
# waits out both timeouts: 10 s took it to 27.9 s under load).
mpirun --mca plm_rsh_agent "$TMP/rsh" --mca oob_tcp_if_include "$NET.0/24" \
  --mca oob_tcp_keepalive_time 4 --mca oob_tcp_keepalive_intvl 2 --mca oob_tcp_keepalive_probes 3 \
  --mca odls_base_sigkill_timeout 5 "${yield[@]}" \
  --mca btl_tcp_if_include "$NET.0/24" --mca btl self,vader,tcp \
  --host "$(IFS=,; echo "${hostlist[*]}")" -np $(( HOSTS * RPH )) --bind-to none \
  -x OMP_NUM_THREADS="${OMP_NUM_THREADS:-1}" "$@"
rc=$?
set -e
exit $rc
