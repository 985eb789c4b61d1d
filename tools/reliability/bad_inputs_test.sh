#!/usr/bin/env bash
# Every bad input of bad_inputs.txt through the dpe tool (bad_inputs.py says what is checked).
set -euo pipefail
exec python3 "$2" "$1" "$3"
