#!/usr/bin/env bash
# Runs a gtest binary ($1) as $3 processes (default 2) of one mpirun launch, each with $2 CPU devices (default
# 2); fails if any process fails. Rank 0
# writes the XML report Bazel asked for (each test case counted once); the other ranks write none.
set -euo pipefail
if [[ "${1:-}" == --rank ]]; then  # inside mpirun: one process
  if [[ "${OMPI_COMM_WORLD_RANK:-0}" != 0 ]]; then unset XML_OUTPUT_FILE; fi
  unset TEST_PREMATURE_EXIT_FILE  # one file for all ranks: gtest's remove would race
  exec "$2"
fi
# CI runs as root, which mpirun refuses unless told; --oversubscribe: two processes on a one-core sandbox too.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# CPU devices per process ($2, default 2) whatever the core count.
export DPE_NUM_CPU_DEVICES=${2:-2}
exec mpirun -np "${3:-2}" --oversubscribe --bind-to none "$0" --rank "$1"
