#!/usr/bin/env bash
# Bad inputs and resource exhaustion end in one line "dpe <command>: <message>" and a documented exit status
# (tools/dpe/main.cc: 2 error, 3 out of memory, 4 unexpected), never in an abort or a hang: endless and
# oversized files, checkpoints whose headers claim more than the file holds, and training under address-space
# limits (ulimit -v), where out of memory once ended in glibc's "libgcc_s.so.1 must be installed for
# unwinding to work" abort (oneDNN), in std::terminate (the worker pool; a tensor's destructor, whose block
# grew the allocator's free list) or in a hang at exit (OpenBLAS).
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
source "$(dirname "$0")/test_lib.sh"  # first_cpus (its expect is replaced below)
# expect STATUS PATTERN ARGS...: `dpe ARGS` exits with STATUS within 60 s and prints PATTERN.
expect() {
  local want_status="$1" pattern="$2"; shift 2
  out=$(timeout 60 "$bin" "$@" 2>&1)
  local status=$?
  if [[ $status -ne $want_status ]] || ! grep -qF -- "$pattern" <<<"$out"; then
    echo "FAILED: dpe $* -> status $status (want $want_status, 124 = timed out), want '$pattern', output:"
    echo "$out" | tail -5
    fail=1
  fi
}

# ---- standard output that cannot be written is a failure, not a success ----
out=$("$bin" devices 2>&1 >/dev/full)
status=$?
if [[ $status -ne 2 ]] || ! grep -q "^dpe devices: cannot write the standard output: No space left on device" <<<"$out"; then
  echo "FAILED: dpe devices >/dev/full: status $status (want 2): $out"; fail=1
fi

# ---- a file size limit below the checkpoint: an error naming both sizes, no SIGXFSZ, no temporary left ----
mkdir -p "$tmp/fsize"
out=$(ulimit -f 1024; timeout 120 "$bin" train --model mlp --epochs 1 --limit 64 --batch-size 32 --save-every 1 \
      --checkpoint "$tmp/fsize/ck.safetensors" 2>&1)
status=$?
if [[ $status -ne 2 ]] || ! grep -q "File too large: the checkpoint is [0-9]* bytes but the file size limit (\`ulimit -f\`, RLIMIT_FSIZE) is 1048576 bytes" <<<"$out"; then
  echo "FAILED: ulimit -f 1024: status $status (want 2, 153 = SIGXFSZ):"; echo "$out" | tail -3; fail=1
fi
if compgen -G "$tmp/fsize/*" >/dev/null; then echo "FAILED: ulimit -f 1024 left $(ls "$tmp/fsize")"; fail=1; fi

# ---- no threads left: `ulimit -u 1` (RLIMIT_NPROC, which binds users other than root) ----
# oneTBB's failure to start a worker is "out of memory or threads" (exit 3), not an unexpected error (4). As an
# unused uid, from a copy of the tool that uid may run. OPENBLAS_NUM_THREADS=1 as the tool sets it: OpenBLAS
# starts its own threads when it is loaded, before dpe runs, and exits the process if it cannot.
if [[ $(id -u) -eq 0 ]] && command -v setpriv >/dev/null; then
  nproc_dir=$(mktemp -d /tmp/dpe_nproc.XXXXXX)
  cp "$bin" "$nproc_dir/dpe" && chmod 755 "$nproc_dir" "$nproc_dir/dpe"
  out=$(timeout 60 setpriv --reuid=48879 --regid=48879 --clear-groups env OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE \
        bash -c 'ulimit -u 1 && exec "$0" train --model mlp --epochs 1 --limit 64 --batch-size 32' \
        "$nproc_dir/dpe" 2>&1)
  status=$?
  if [[ $status -ne 3 ]] || ! grep -q "^dpe train: out of memory or threads: oneTBB could not start a worker thread" <<<"$out"; then
    echo "FAILED: ulimit -u 1: status $status (want 3):"; echo "$out" | tail -3; fail=1
  fi
  rm -rf "$nproc_dir"
else
  echo "note: ulimit -u 1 not tried: it needs root (to run as another uid, which RLIMIT_NPROC binds) and setpriv"
fi

# ---- endless and oversized data files ----
mkdir -p "$tmp/dir" "$tmp/idx"
expect 2 "dpe train: load_text_corpus: /dev/zero holds more than 268435456 bytes (the limit" \
  train --model tiny-llama --data-dir /dev/zero --epochs 1
expect 2 "dpe train: cannot read $tmp/dir: Is a directory" train --model tiny-llama --data-dir "$tmp/dir" --epochs 1
expect 2 "cannot open /dev/zero/train-labels-idx1-ubyte.gz: Not a directory" \
  train --model mlp --data-dir /dev/zero --epochs 1
# IDX headers promising 2^32 - 1 labels and 2^40 image bytes in files of a few bytes (plain files: zlib reads
# them unchanged): refused before anything is allocated.
python3 - "$tmp/idx" <<'PY'
import struct, sys
d = sys.argv[1]
open(f"{d}/train-labels-idx1-ubyte.gz", "wb").write(struct.pack(">II", 0x801, 0xFFFFFFFF) + b"\x01" * 10)
open(f"{d}/train-images-idx3-ubyte.gz", "wb").write(struct.pack(">IIII", 0x803, 65536, 65536, 256))
PY
expect 2 "the header promises 4294967295 items of 1 bytes (4294967295 bytes) but the file holds only 10 bytes" \
  train --model mlp --data-dir "$tmp/idx" --epochs 1

# ---- checkpoints whose headers claim more than the file holds ----
python3 - "$tmp" <<'PY'
import json, struct, sys
d = sys.argv[1]
def write(name, header, data=b"", length=None):
    text = json.dumps(header).encode()
    with open(f"{d}/{name}", "wb") as f:
        f.write(struct.pack("<Q", len(text) if length is None else length) + text + data)
# numel * 8 wraps to 0 bytes: once accepted with an empty range.
write("wrap.safetensors", {"0.weight": {"dtype": "F64", "shape": [2**62], "data_offsets": [0, 0]}})
# 2^40 bytes claimed, 16 present.
write("huge.safetensors", {"0.weight": {"dtype": "F32", "shape": [2**18, 2**20], "data_offsets": [0, 2**40]}},
      b"x" * 16)
# a header length of 2^40.
write("badlen.safetensors", {}, length=2**40)
PY
expect 2 "load_checkpoint: $tmp/wrap.safetensors: entry '0.weight': shape is too large: F64 [4611686018427387904]" \
  train --model mlp --resume "$tmp/wrap.safetensors" --epochs 1
expect 2 "data_offsets [0, 1099511627776] lie outside the 16-byte data section" \
  train --model mlp --resume "$tmp/huge.safetensors" --epochs 1
expect 2 "bad header length 1099511627776" train --model mlp --resume "$tmp/badlen.safetensors" --epochs 1

# ---- training under address-space limits ----
# Whatever runs out first, the tool reports it (2: dpe's allocator or a converted oneDNN failure; 3: a
# std::bad_alloc or a thread that could not start) or trains to the end (0). Not allowed: 134 (SIGABRT:
# glibc's unwinding abort, std::terminate) and 124 (a hang). Tolerated, because nothing outside them can
# change it (core/kernels/onednn_cpu.cc, Note [Exceptions and oneDNN]): 139 (oneDNN 2.6's JIT writing through
# a code buffer it failed to allocate; rare since dpe checks for address space before oneDNN generates kernels) and 1 after a "libgomp: ..." line (the OpenMP runtime's own exit when
# it cannot allocate or start a thread).
# On two CPUs (taskset) with one CPU device each, whatever the machine: each device runs oneDNN with one OpenMP
# thread and oneTBB starts one worker, as on the 2-core machines this was measured on. With more, the
# outcome belongs to the libraries' thread pools, which nothing outside them can change: an exception on one
# of oneDNN's OpenMP threads ends in std::terminate, and oneTBB starts its workers from one another (a worker
# that wakes wakes more) and its own thread throws "pthread_create has failed" when the next cannot start
# (seen on the 16-core GPU machine, where the main thread's random initialisation asks for 15 workers). CPU
# devices even where there is a GPU (the CUDA runtime reserves more address space than these limits).
pin=(taskset -c "$(first_cpus 2)")
cores=$("${pin[@]}" nproc)
ids=$(seq -s, -f "cpu:%g" 0 $((cores - 1)))
export DPE_NUM_CPU_DEVICES="$cores"
# The settings the tool would set and restart itself with (tools/dpe/main.cc), given from the start: OpenBLAS
# starts a pool thread per core when it is loaded, before main, and on the 16-core GPU machine those threads'
# stacks and malloc arenas near the limit made its loader exit ("blas_thread_init: pthread_create failed",
# status 130), which no code of dpe's runs early enough to prevent.
export OPENBLAS_NUM_THREADS=1 OMP_WAIT_POLICY=PASSIVE
# And one OpenMP thread on the main thread, which evaluates the test set with oneDNN (see above).
export OMP_NUM_THREADS=1
# The limits are above the address space the tool needs just to start: its shared libraries alone map about
# 100 MB in the CPU-only build and about 1 GB in the CUDA build (cuBLAS, cuDNN, NCCL), where a fixed limit
# would only test the dynamic loader. That base is found by bisection on `dpe train --help`.
lo=10000 hi=16000000
if ! (ulimit -v "$hi"; "${pin[@]}" "$bin" train --help >/dev/null 2>&1); then
  echo "FAILED: dpe train --help does not run under ulimit -v $hi"; exit 1
fi
while ((hi - lo > 2000)); do
  mid=$(((lo + hi) / 2))
  if (ulimit -v "$mid"; "${pin[@]}" "$bin" train --help >/dev/null 2>&1); then hi=$mid; else lo=$mid; fi
done
echo "the tool starts under ulimit -v $hi (KiB)"
reported=0
for extra in 2000 25000 50000 75000 100000 150000 200000 300000; do
  kib=$((hi + extra))
  for model in mlp cnn; do
    out=$(ulimit -v "$kib"; timeout 120 "${pin[@]}" "$bin" train --model "$model" --device-ids "$ids" --epochs 1 --limit 256 \
          --batch-size 64 2>&1)
    status=$?
    case "$status" in
      0) ;;
      2|3)
        if ! tail -1 <<<"$out" | grep -q "^dpe train: "; then
          echo "FAILED: ulimit -v $kib, $model: status $status without a 'dpe train: ' line:"; echo "$out" | tail -3
          fail=1
        fi
        reported=$((reported + 1)) ;;
      139) echo "note: ulimit -v $kib, $model: SIGSEGV (oneDNN's JIT, see above)" ;;
      1) if grep -q "^libgomp: " <<<"$out"; then echo "note: ulimit -v $kib, $model: libgomp exit";
         else echo "FAILED: ulimit -v $kib, $model: status 1:"; echo "$out" | tail -3; fail=1; fi ;;
      *) echo "FAILED: ulimit -v $kib, $model: status $status (134 = abort, 124 = hang):"; echo "$out" | tail -3
         fail=1 ;;
    esac
  done
done
if [[ $reported -eq 0 ]]; then echo "FAILED: no run under ulimit -v reported running out of memory"; fail=1; fi
exit $fail
