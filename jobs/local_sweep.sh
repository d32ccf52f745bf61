#!/usr/bin/env bash
# A sweep on this machine with mpirun (no SLURM): jobs/sweep.py --local with the same options.
#   jobs/local_sweep.sh --nodes 1,2 --ranks-per-node 2 --strategies ring,allgather --seq 1K,2K \
#                       --out out/sweep -- heads=4 kv_heads=4 head_dim=32 steps=3
# "nodes" multiplies the rank count here (P = nodes x ranks-per-node, all on this machine).
set -euo pipefail
exec /usr/bin/python3 "$(dirname "$0")/sweep.py" --local "$@"
