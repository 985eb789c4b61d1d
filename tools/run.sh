#!/usr/bin/env bash
# The main job. For now: the core's end-to-end check (examples/core_smoke.cc); the `dpe` tool replaces it.
set -euo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel run //examples:core_smoke -- "$@"
