#!/bin/sh
echo "coverage is not supported in dpe's offline Bazel build" >&2
exit 1
