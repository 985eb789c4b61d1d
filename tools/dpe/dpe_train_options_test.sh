#!/usr/bin/env bash
# Every option of dpe train, generated from its help: a difference between two MPI processes, and a change on
# --resume, is refused naming the option unless the help lists it among those that may differ or change
# (tools/dpe/dpe_train_options_test.py).
set -uo pipefail
bin="$1"
here="$(dirname "$0")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
python3 "$here/dpe_train_options_test.py" "$bin" "$tmp/options"
