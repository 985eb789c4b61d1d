#!/usr/bin/env bash
# `dpe train --dist mpi` across two hosts: two network namespaces joined by a veth pair, each with its own
# hostname, one process in each, Open MPI's TCP transport between them (mpirun starts the second process
# through an agent that enters the other namespace, as ssh would log in to another machine). The run must
# write the same checkpoint, byte for byte, as one process with two devices. Needs root (CI runs as root);
# where namespaces cannot be made, the test reports itself skipped with the reason.
set -uo pipefail
bin="$(realpath "$1")"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"

skip() {  # skip REASON: a skipped test case in Bazel's report (tools/test_summary.py counts it as skipped)
  echo "SKIPPED: $1"
  local message=${1//&/&amp;}
  message=${message//</&lt;}
  message=${message//\"/&quot;}
  if [[ -n "${XML_OUTPUT_FILE:-}" ]]; then
    cat > "$XML_OUTPUT_FILE" <<XML
<?xml version="1.0" encoding="UTF-8"?>
<testsuites tests="1" failures="0" skipped="1"><testsuite name="dpe_two_hosts_test" tests="1" failures="0" skipped="1">
<testcase name="TrainAcrossTwoHosts" classname="dpe_two_hosts_test" result="skipped"><skipped message="$message"/></testcase>
</testsuite></testsuites>
XML
  fi
  exit 0
}

[[ $(id -u) -eq 0 ]] || skip "network namespaces need root (uid $(id -u))"
command -v ip > /dev/null && command -v unshare > /dev/null || skip "ip (iproute2) or unshare (util-linux) is missing"
# Names and a subnet of this run's own, so that concurrent runs do not meet.
id=$(( $$ % 200 + 20 ))
h1="dpe$$-h1" h2="dpe$$-h2" net="10.77.$id"
cleanup() { ip netns del "$h1" 2> /dev/null; ip netns del "$h2" 2> /dev/null; }
trap cleanup EXIT
ip netns add "$h1" 2> "$tmp/netns.err" || skip "cannot make a network namespace: $(head -1 "$tmp/netns.err")"
fail() { echo "FAILED: $*"; exit 1; }
ip netns add "$h2" && ip link add "dpe$$a" type veth peer name "dpe$$b" &&
  ip link set "dpe$$a" netns "$h1" && ip link set "dpe$$b" netns "$h2" &&
  ip -n "$h1" addr add "$net.1/24" dev "dpe$$a" && ip -n "$h2" addr add "$net.2/24" dev "dpe$$b" &&
  ip -n "$h1" link set "dpe$$a" up && ip -n "$h2" link set "dpe$$b" up &&
  ip -n "$h1" link set lo up && ip -n "$h2" link set lo up || fail "could not join the namespaces"

# mpirun's remote-shell agent: "agent HOST COMMAND..." runs COMMAND in HOST's namespace under HOST's name.
cat > "$tmp/agent.sh" <<AGENT
#!/bin/bash
[[ "\$1" == "$net.2" ]] || { echo "agent.sh: unknown host \$1" >&2; exit 1; }
shift
exec ip netns exec "$h2" unshare --uts /bin/sh -c "hostname dpe-host2; \$*"
AGENT
chmod +x "$tmp/agent.sh"

export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1 DPE_NUM_CPU_DEVICES=2
exact=(--model mlp --mode ddp --limit 1000 --seed 3 --lr 0.05 --batch-size 60 --schedule constant --save-every 1
       --epochs 2)
# The launch on host 1, a shell command line (fixed strings and this test's own paths only).
dpe_on_hosts="hostname dpe-host1; exec mpirun --host $net.1,$net.2 -np 2 --mca plm_rsh_agent $tmp/agent.sh \
  --mca btl self,tcp --mca btl_tcp_if_include $net.0/24 --mca oob_tcp_if_include $net.0/24 -x DPE_NUM_CPU_DEVICES $bin"
launch="$dpe_on_hosts train --dist mpi ${exact[*]} --device-ids cpu:0 --checkpoint $tmp/hosts.ck"
out=$(timeout 180 ip netns exec "$h1" unshare --uts /bin/sh -c "$launch" 2>&1) || { echo "$out" | tail -20; fail "the two-host run"; }
echo "$out" | grep -E '^(dpe train|final)'
# Each host's process is local rank 0 of 1, under its own host name.
devices="$dpe_on_hosts devices --dist mpi --device-ids cpu:0"
out=$(timeout 120 ip netns exec "$h1" unshare --uts /bin/sh -c "$devices" 2>&1) || { echo "$out" | tail -20; fail "dpe devices"; }
echo "$out" | grep replica
grep -q "replica 0: cpu:0 of process 0 (local rank 0 of 1) on dpe-host1" <<<"$out" &&
  grep -q "replica 1: cpu:0 of process 1 (local rank 0 of 1) on dpe-host2" <<<"$out" || fail "dpe devices --dist mpi: $out"
out=$("$bin" train "${exact[@]}" --device-ids cpu:0,cpu:1 --checkpoint "$tmp/one.ck" 2>&1) || { echo "$out"; fail "the one-process run"; }
cmp -s "$tmp/hosts.ck" "$tmp/one.ck" || fail "2 hosts x 1 device wrote another checkpoint than 1 process x 2 devices"
echo "2 hosts x 1 device = 1 process x 2 devices, checkpoint byte for byte"
