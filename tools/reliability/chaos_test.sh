#!/usr/bin/env bash
# The chaos soak's short version (tools/reliability/chaos.py): 5 faults in one process (SIGKILL, a device
# failure, a full disk) and 4 across two MPI processes (SIGKILL and SIGSTOP of a rank, a device failure, a full
# disk), every kind at least once, each job restarted from its newest checkpoint, ending with the uninterrupted
# run's checkpoint byte for byte.
set -uo pipefail
bin="$1"
chaos="$2"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
python3 "$chaos" "$bin" --faults 5 --seed 11 --workdir "$tmp/one" || fail=1
python3 "$chaos" "$bin" --faults 4 --seed 12 --mpi --workdir "$tmp/mpi" || fail=1
exit $fail
