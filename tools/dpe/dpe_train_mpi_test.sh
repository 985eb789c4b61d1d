#!/usr/bin/env bash
# `mpirun -np 2 dpe train --dist mpi` on a slice of Fashion-MNIST: 2 processes x 1 CPU device train like 1
# process x 2 devices, in DDP mode (the same loss and accuracy every epoch, the same checkpoint byte for byte,
# SyncBatchNorm included) and in DP mode (the same losses and accuracies), and process 0 alone prints and writes; a checkpoint written by process 0 and resumed by both
# continues exactly like the uninterrupted run; dpe bench --dist mpi shows one row for the group; kill -9 of one
# rank ends the job at once, naming it; what --dist mpi cannot do is refused with the value named.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
export DPE_NUM_CPU_DEVICES=2
source "$(dirname "$0")/test_lib.sh"  # run, expect, first_cpus
# CI runs as root, which mpirun refuses unless told.
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
# A hardware thread per process where there are two, and the one-process runs on two of them, one for each of
# its two devices: the kernels then split their work alike (a thread each) and the results agree bit for bit.
# Without the taskset, one process on the 16-core GPU machine gave each device 8 threads, which sum in another
# order (its checkpoints differed from the two processes').
if (( $(nproc) >= 2 )); then
  bind=(--bind-to hwthread)
  one=(taskset -c "$(first_cpus 2)")
else
  bind=(--oversubscribe --bind-to none)
  one=()
fi
mpi=(timeout 120 mpirun -np 2 "${bind[@]}" "$bin" train --dist mpi)
common=(--model mlp --mode ddp --limit 1000 --seed 3 --lr 0.05)
fail=0
# same_report A B: the two --json reports agree on the losses and accuracies of every epoch
same_report() {
  python3 - "$1" "$2" <<'PY' || fail=1
import json, sys
a, b = (json.load(open(p)) for p in sys.argv[1:3])
key = lambda r: ([(e["epoch"], e["train_loss"], e["test_accuracy"]) for e in r["epochs"]], r["final_test_accuracy"])
if key(a) != key(b):
    sys.exit(f"FAILED: {sys.argv[1]} and {sys.argv[2]} differ:\n{key(a)}\n{key(b)}")
print("same losses and accuracies:", key(a))
PY
}

run "2 processes" "${mpi[@]}" "${common[@]}" --batch-size 64 --device-ids cpu:0 --epochs 2 --json "$tmp/mpi.json"
echo "$out" | tail -3
headers=$(grep -c '^dpe train: mlp, mode ddp on cpu:0 in each of 2 processes' <<<"$out")
finals=$(grep -c '^final test accuracy' <<<"$out")
[[ $headers -eq 1 && $finals -eq 1 ]] || { echo "FAILED: $headers headers and $finals final lines (want 1 each)"; fail=1; }
python3 -c "import json, sys; sys.exit(json.load(open('$tmp/mpi.json'))['processes'] != 2)" || { echo "FAILED: processes"; fail=1; }
run "1 process" "${one[@]}" "$bin" train "${common[@]}" --batch-size 64 --device-ids cpu:0,cpu:1 --epochs 2 --json "$tmp/one.json"
same_report "$tmp/mpi.json" "$tmp/one.json"

# DP mode across processes: a master per process, the masters' gradients averaged; the same report as one
# process's DP over both devices.
run "dp, 2 processes" "${mpi[@]}" "${common[@]/ddp/dp}" --batch-size 64 --device-ids cpu:0 --epochs 2 --json "$tmp/dp2.json"
grep -q '^dpe train: mlp, mode dp on cpu:0 in each of 2 processes' <<<"$out" || { echo "FAILED: dp header: $out"; fail=1; }
run "dp, 1 process" "${one[@]}" "$bin" train "${common[@]/ddp/dp}" --batch-size 64 --device-ids cpu:0,cpu:1 --epochs 2 --json "$tmp/dp1.json"
same_report "$tmp/dp2.json" "$tmp/dp1.json"

# Process 0 writes the checkpoints; both processes resume from one. Exact: 1 epoch + a resumed 2nd gives the
# same checkpoint, byte for byte, as 2 epochs in one run, and as one process with both devices. (Constant
# schedule: a cosine schedule depends on --epochs, so a 1-epoch run is not the first half of a 2-epoch one.)
exact=("${common[@]}" --batch-size 60 --schedule constant --save-every 1)
run "2 epochs" "${mpi[@]}" "${exact[@]}" --device-ids cpu:0 --epochs 2 --checkpoint "$tmp/a.ck"
run "1 epoch" "${mpi[@]}" "${exact[@]}" --device-ids cpu:0 --epochs 1 --checkpoint "$tmp/b.ck"
run "resumed" "${mpi[@]}" "${exact[@]}" --device-ids cpu:0 --epochs 2 --checkpoint "$tmp/c.ck" --resume "$tmp/b.ck"
grep -q "resumed after epoch 1" <<<"$out" || { echo "FAILED: not resumed: $out"; fail=1; }
cmp -s "$tmp/a.ck" "$tmp/c.ck" || { echo "FAILED: the resumed checkpoint differs from the uninterrupted one"; fail=1; }
run "1 process, 2 epochs" "${one[@]}" "$bin" train "${exact[@]}" --device-ids cpu:0,cpu:1 --epochs 2 --checkpoint "$tmp/one.ck"
cmp -s "$tmp/a.ck" "$tmp/one.ck" || { echo "FAILED: 2 processes' checkpoint differs from 1 process's"; fail=1; }

# ZeRO-2 across processes: each process holds half of the optimizer state (one device of two); process 0
# saves the whole state gathered from both, which is the plain DDP run's (its weights and Adam moments within
# 1e-5; the sums differ in order), and a single process resumes it.
zero=(--model mlp --mode ddp --limit 1000 --seed 3 --batch-size 60 --schedule constant --save-every 1 --optimizer adam
      --lr 0.001)
run "zero2, 2 processes" "${mpi[@]}" "${zero[@]}" --zero 2 --device-ids cpu:0 --epochs 2 --checkpoint "$tmp/z2.ck"
run "ddp, 1 process" "${one[@]}" "$bin" train "${zero[@]}" --device-ids cpu:0,cpu:1 --epochs 2 --checkpoint "$tmp/z0.ck"
python3 - "$tmp/z2.ck" "$tmp/z0.ck" <<'PY' || { echo "FAILED: ZeRO-2 across processes differs from DDP"; fail=1; }
import array, json, struct, sys
def tensors(path):
    data = open(path, "rb").read()
    (n,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + n])
    out = {}
    for name, meta in header.items():
        if name == "__metadata__" or meta["dtype"] != "F32":
            continue
        begin, end = meta["data_offsets"]
        out[name] = array.array("f", data[8 + n + begin:8 + n + end])
    return out
a, b = tensors(sys.argv[1]), tensors(sys.argv[2])
assert a.keys() == b.keys() and any(k.startswith("optimizer.state.") for k in a), sorted(a)
for k in a:
    worst = max((abs(x - y) - 1e-4 * abs(y) for x, y in zip(a[k], b[k])), default=0)
    assert worst <= 1e-6, (k, worst)
print(len(a), "tensors agree")
PY
run "zero2 resumed in 1 process" "${one[@]}" "$bin" train "${zero[@]}" --device-ids cpu:0,cpu:1 --epochs 3 \
  --checkpoint "$tmp/z3.ck" --resume "$tmp/z2.ck"
grep -q "resumed after epoch 2" <<<"$out" || { echo "FAILED: not resumed: $out"; fail=1; }

# SyncBatchNorm across processes: the CNN's statistics over every replica of both processes, byte for byte
# those of one process with both devices.
bn=(--model cnn --sync-bn --mode ddp --limit 256 --seed 3 --batch-size 64 --schedule constant --save-every 1 --epochs 1)
run "sync-bn, 2 processes" "${mpi[@]}" "${bn[@]}" --device-ids cpu:0 --checkpoint "$tmp/bn2.ck"
run "sync-bn, 1 process" "${one[@]}" "$bin" train "${bn[@]}" --device-ids cpu:0,cpu:1 --checkpoint "$tmp/bn1.ck"
cmp -s "$tmp/bn2.ck" "$tmp/bn1.ck" || { echo "FAILED: SyncBatchNorm across 2 processes differs from 1 process"; fail=1; }

# dpe bench --dist mpi: a dp-mpi, a ddp-mpi and a ddp-no-sync-mpi row (the group exchanging nothing) for both
# processes' devices, printed and written by process 0 alone.
bench=(timeout 120 mpirun -np 2 "${bind[@]}" "$bin" bench --dist mpi --device-ids cpu:0 --model mlp --batch-size 64
       --steps 2 --warmup 1)
run "bench" "${bench[@]}" --modes dp,ddp,ddp-no-sync --json "$tmp/bench.json"
rows=$(grep -cE '^dpe *(d?dp|ddp-no-sync)-mpi *2 ' <<<"$out")
[[ $rows -eq 3 ]] || { echo "FAILED: $rows dp-mpi, ddp-mpi and ddp-no-sync-mpi rows (want 3): $out"; fail=1; }
python3 -c "import json, sys; r = json.load(open(sys.argv[1]))['rows']; sys.exit(not ([x['config'] for x in r] ==
  ['dp-mpi', 'ddp-mpi', 'ddp-no-sync-mpi'] and all(x['devices'] == 2 and x['samples_per_s'] > 0 for x in r) and
  r[2]['phases_ms']['reduce'] == 0 < r[1]['phases_ms']['reduce']))" "$tmp/bench.json" ||
  { echo "FAILED: the bench --json report"; fail=1; }
# The FMA-peak limit is the group's: process 0's CPUs times the processes (the rows count every process's devices).
grep -qE '^# FMA-peak limit: [0-9]+ samples/s \(.* FMA probe on .*, x 2 processes \(process 0.s\) = [0-9.]+ GFLOP/s' <<<"$out" ||
  { echo "FAILED: the FMA-peak limit is not 2 processes': $out"; fail=1; }

# kill -9 of rank 1 mid-training: the job ends at once (no rank waits for it), non-zero, naming rank 1.
# Its --json path names its processes apart from any other test's running beside it.
"${mpi[@]}" "${common[@]}" --batch-size 64 --device-ids cpu:0 --epochs 100000 --json "$tmp/kill.json" \
  > "$tmp/kill.log" 2>&1 &
launcher=$!
victim=""
for _ in $(seq 600); do  # up to 60 s for training to start
  if grep -q '^dpe train:' "$tmp/kill.log"; then
    for pid in $(pgrep -f -- "--json $tmp/kill.json"); do
      if tr '\0' '\n' < "/proc/$pid/environ" 2>/dev/null | grep -qx 'OMPI_COMM_WORLD_RANK=1'; then victim=$pid; fi
    done
    [[ -n "$victim" ]] && break
  fi
  sleep 0.1
done
if [[ -z "$victim" ]]; then
  echo "FAILED: rank 1 never started training"; cat "$tmp/kill.log"; fail=1; kill "$launcher" 2>/dev/null
else
  kill -9 "$victim"
  start=$SECONDS
  wait "$launcher"
  status=$?
  if [[ $status -eq 0 || $status -eq 124 ]] || ! grep -q 'process rank 1 .* exited on signal 9' "$tmp/kill.log"; then
    echo "FAILED: after kill -9 of rank 1: status $status (124 = still running after 120 s), output:"
    tail -8 "$tmp/kill.log"; fail=1
  else
    echo "kill -9 of rank 1: the job ended in $((SECONDS - start)) s with status $status"
  fi
fi

expect 2 "--modes single,ddp with --dist mpi: single runs on one device; expected ddp, dp, ddp-zero1, ddp-zero2 and/or ddp-no-sync" \
  timeout 30 "$bin" bench --dist mpi --modes single,ddp
expect 2 "--dist mpi needs --mode ddp or dp (--mode single trains one device)" \
  timeout 30 "$bin" train --dist mpi --mode single
expect 2 "--batch-size 30 with --dist mpi: the global batch must be a multiple of the 4 DDP replicas (2 processes x 2 devices); try 28 or 32" \
  "${mpi[@]}" "${common[@]}" --device-ids cpu:0,cpu:1 --batch-size 30
# The Llama on token shards across processes: 2 processes x 1 device (each its slice of every global batch of
# windows) train like 1 process x 2 devices, step by step.
printf '%s\n\n' $(python3 -c "import random; random.seed(3); w='the quick brown fox jumps over a lazy dog'.split(); print(' '.join('_'.join(random.choice(w) for _ in range(40)) for _ in range(200)))") \
  > "$tmp/corpus.txt"
run "tokenize" "$bin" tokenize --input "$tmp/corpus.txt" --vocab-size 300 --out "$tmp/shards"
llama=(--model llama --llama-preset tiny --data "$tmp/shards" --seq-len 16 --batch-size 8 --max-steps 6 --lr 3e-3 --seed 3)
run "llama, 2 processes" "${mpi[@]}" "${llama[@]}" --mode ddp --device-ids cpu:0 --json "$tmp/llama2.json"
run "llama, 1 process" "${one[@]}" "$bin" train "${llama[@]}" --mode ddp --device-ids cpu:0,cpu:1 --json "$tmp/llama1.json"
python3 - "$tmp/llama2.json" "$tmp/llama1.json" <<'PY' || fail=1
import json, sys
a, b = ([float(s["train_loss"]) for s in json.load(open(f))["steps"]] for f in sys.argv[1:])
if len(a) != 6 or max(abs(x - y) for x, y in zip(a, b)) > 1e-5:
    sys.exit(f"FAILED: llama across processes {a} != one process {b}")
print("llama: the same losses across 2 processes as in one:", a)
PY

# One configuration per launch (Note [A run's configuration]): processes given different training options are
# refused at start-up, on every rank, naming the option and both values; their devices and paths may differ.
for differ in "--epochs 2 : --epochs 1:--epochs: rank 0 has '2', rank 1 has '1'" \
              "--epochs 1 --lr 0.05 : --epochs 1 --lr 0.01:--lr: rank 0 has '0.05', rank 1 has '0.01'"; do
  IFS=: read -r first second want <<<"$differ"
  out=$(timeout 60 mpirun "${bind[@]}" -np 1 "$bin" train --dist mpi --model mlp --mode ddp --limit 256 --device-ids cpu:0 \
        $first : -np 1 "$bin" train --dist mpi --model mlp --mode ddp --limit 256 --device-ids cpu:1 $second 2>&1)
  [[ $(grep -cF -- "$want" <<<"$out") -eq 2 ]] || { echo "FAILED: ranks with $first / $second: want '$want' from both:"; echo "$out" | tail -5; fail=1; }
done
# Every option one by one: dpe_train_options_test. What the processes read is compared by content, whatever
# the paths (Note [What the processes read must be the same]): a copy of the data set is accepted, a copy with
# one byte more is refused naming the file, and so is a checkpoint to resume that differs between them.
mkdir -p "$tmp/fm_copy" "$tmp/fm_other"
cp /usr/share/datasets/fashion-mnist/*.gz "$tmp/fm_copy/" && cp /usr/share/datasets/fashion-mnist/*.gz "$tmp/fm_other/"
printf 'x' >> "$tmp/fm_other/t10k-labels-idx1-ubyte.gz"
two_data() {  # two_data DIR_OF_RANK_1 EXTRA...: rank 0 reads the installed data set, rank 1 DIR
  local dir="$1"; shift
  timeout 60 mpirun "${bind[@]}" -np 1 "$bin" train --dist mpi --model mlp --mode ddp --limit 256 --epochs 1 \
    --device-ids cpu:0 "$@" : -np 1 "$bin" train --dist mpi --model mlp --mode ddp --limit 256 --epochs 1 \
    --device-ids cpu:1 --data-dir "$dir" "$@" 2>&1
}
out=$(two_data "$tmp/fm_copy") || { echo "FAILED: a copy of the data set on rank 1 was refused:"; echo "$out" | tail -5; fail=1; }
out=$(two_data "$tmp/fm_other")
want="--dist: the processes read different inputs; --data-dir file t10k-labels-idx1-ubyte.gz: rank 0 has '"
[[ $(grep -cF -- "$want" <<<"$out") -eq 2 ]] || { echo "FAILED: different data: want '$want' from both:"; echo "$out" | tail -5; fail=1; }
run "a checkpoint to resume" "$bin" train --model mlp --mode ddp --limit 256 --epochs 1 --save-every 1 \
  --checkpoint "$tmp/resume_a.safetensors"
run "the same run one epoch further" "$bin" train --model mlp --mode ddp --limit 256 --epochs 2 --save-every 1 \
  --checkpoint "$tmp/resume_b.safetensors" --resume "$tmp/resume_a.safetensors"
out=$(timeout 60 mpirun "${bind[@]}" -np 1 "$bin" train --dist mpi --model mlp --mode ddp --limit 256 --epochs 3 \
  --device-ids cpu:0 --resume "$tmp/resume_a.safetensors" : -np 1 "$bin" train --dist mpi --model mlp --mode ddp \
  --limit 256 --epochs 3 --device-ids cpu:1 --resume "$tmp/resume_b.safetensors" 2>&1)
want="--dist: the processes read different inputs; --resume: rank 0 has 'step "
[[ $(grep -cF -- "$want" <<<"$out") -eq 2 ]] || { echo "FAILED: different checkpoints: want '$want' from both:"; echo "$out" | tail -5; fail=1; }
# Several processes of one launch without --dist would each train alone, writing the same checkpoint.
expect 2 "this process is one of 2 of an MPI launch (OMPI_COMM_WORLD_SIZE=2) but --dist is none" \
  timeout 60 mpirun -np 2 "${bind[@]}" "$bin" train --model mlp --limit 256 --epochs 1
exit $fail
