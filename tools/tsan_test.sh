#!/usr/bin/env bash
# The concurrent code's tests under ThreadSanitizer (--config=tsan: dbg build, own output tree): the backward
# profiler, the oneDNN primitive cache, the worker pool, both DataParallel modes and their reducers, the
# deterministic mode's sums across devices, ZeRO's shards and activation checkpointing in every mode, the collectives, SyncBatchNorm, the data loader's prefetch thread.
# Ends with the same "N passed, N failed, N skipped" line as tools/test.sh. Extra arguments go to `bazel test`
# (e.g. --runs_per_test=5 to hunt for a flaky race).
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
targets=(
  //core:profiler_test
  //core:primitive_cache_cpu_test
  //engine:worker_pool_test
  //engine:data_parallel_test
  //engine:dp_reducer_test
  //engine:ddp_test
  //engine:mode_switch_test
  //engine:auto_split_test
  //engine:batch_split_test
  //engine:device_failure_test
  //engine:deterministic_race_test
  //engine:zero_step_test
  //engine:activation_checkpointing_test
  //scatter_gather/...
  //collectives/...
  //layers:sync_batchnorm_test
  //data/...
)
# Left out: the tests that run under mpirun (//collectives:mpi_*). Open MPI is Debian's uninstrumented build, so
# TSan cannot see the ordering its requests give (MPI_Test before reading a buffer) and would report its internals.
excluded=(
  //collectives:mpi_world_test
  //collectives:mpi_backend_test
  //collectives:mpi_nccl_backend_test
  //collectives:mpi_nccl_backend_one_process_test
  //collectives:mpi_nccl_backend_three_process_test
)
bazel test --config=tsan "$@" -- "${targets[@]}" "${excluded[@]/#/-}"
status=$?
bazel query "tests(set(${targets[*]})) except set(${excluded[*]})" 2>/dev/null > bazel-tsan-targets.txt
python3 tools/test_summary.py bazel-out/k8-dbgtsan/testlogs "$status" bazel-tsan-targets.txt
