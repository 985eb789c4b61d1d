#!/usr/bin/env bash
# Runs an example binary (first argument) as a test: its exit status is the verdict.
set -euo pipefail
exec "$1"
