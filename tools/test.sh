#!/usr/bin/env bash
# Runs every dpe test and ends with "N passed, N failed, N skipped" (counted per test case).
# CUDA tests report themselves skipped on machines without a GPU. The tests whose paths depend on the CPU's
# instruction set run again under each cap below it (DPE_MAX_CPU_ISA=avx2, avx512: targets <test>_isa_<cap>;
# a cap above the CPU reports itself skipped), and a line per instruction set comes before the total.
# Extra arguments go to `bazel test`.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh
bazel test //... "$@"
status=$?
# Only the reports of today's test targets count: bazel-testlogs keeps those of deleted targets too. Manual
# targets (run by name elsewhere, e.g. tools/tsan_test.sh) are not part of `//...`.
bazel query 'tests(//...) except attr("tags", "manual", //...)' 2>/dev/null > bazel-test-targets.txt
python3 tools/test_summary.py bazel-testlogs "$status" bazel-test-targets.txt
