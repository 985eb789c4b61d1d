#!/usr/bin/env bash
# `dpe train --model llama` end to end on shards `dpe tokenize` writes from generated text: the validation loss
# falls; DP and DDP give the same losses; --grad-accum 4 at batch B is one step at batch 4B; a run of 12 steps
# and a run of 6 resumed for 6 more write the same checkpoint, byte for byte; document packing trains; the
# JSON report carries tokens/s and MFU; a resumed run keeps its configuration unless --override says; the
# options of the two kinds of model are refused with the other.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
fail=0
source "$(dirname "$0")/test_lib.sh"

python3 - "$tmp/corpus.txt" <<'EOF'
import random, sys
random.seed(7)
words = "the quick brown fox jumps over a lazy dog while seven wizards quietly judge boxing matches".split()
docs = [" ".join(random.choice(words) for _ in range(random.randint(20, 60))) + "." for _ in range(300)]
open(sys.argv[1], "w").write("\n\n".join(docs))
EOF
run "tokenize" "$bin" tokenize --input "$tmp/corpus.txt" --vocab-size 300 --out "$tmp/shards"

base=(train --model llama --llama-preset tiny --data "$tmp/shards" --lr 3e-3 --seed 3)
llama=("${base[@]}" --seq-len 32)
# The losses a JSON report lists, one per line.
losses() { python3 -c "import json, sys; print('\n'.join(s['train_loss'] for s in json.load(open(sys.argv[1]))['steps']))" "$1"; }

# Learns: the validation loss at the end is below the first evaluation's.
run "ddp learns" "$bin" "${llama[@]}" --mode ddp --batch-size 8 --max-steps 30 --eval-every 5 --json "$tmp/ddp.json"
python3 - "$tmp/ddp.json" <<'EOF' || fail=1
import json, sys
steps = json.load(open(sys.argv[1]))["steps"]
val = [float(s["val_loss"]) for s in steps if "val_loss" in s]
assert len(val) == 6 and val[-1] < val[0] - 0.5, f"validation losses {val}: expected a fall of more than 0.5"
assert all(float(s["tokens_per_s"]) > 0 and 0 < float(s["mfu"]) < 2 for s in steps), "tokens_per_s / mfu missing"
EOF

# DP and DDP: the same losses, step by step (to the report's 6 digits, within float32 rounding).
run "dp" "$bin" "${llama[@]}" --mode dp --batch-size 8 --max-steps 30 --eval-every 5 --json "$tmp/dp.json"
python3 - "$tmp/dp.json" "$tmp/ddp.json" <<'EOF' || fail=1
import json, sys
a, b = ([float(s["train_loss"]) for s in json.load(open(f))["steps"]] for f in sys.argv[1:])
assert len(a) == len(b) == 30 and max(abs(x - y) for x, y in zip(a, b)) < 2e-4, f"dp {a[-3:]} ddp {b[-3:]}"
EOF

# Gradient accumulation: 4 micro-steps of 2 rows are one step of 8 rows (ddp: no_sync on the first three).
run "accum" "$bin" "${llama[@]}" --mode ddp --batch-size 2 --grad-accum 4 --max-steps 30 --json "$tmp/accum.json"
python3 - "$tmp/accum.json" "$tmp/ddp.json" <<'EOF' || fail=1
import json, sys
a, b = ([float(s["train_loss"]) for s in json.load(open(f))["steps"]] for f in sys.argv[1:])
assert max(abs(x - y) for x, y in zip(a, b)) < 2e-4, f"accumulated {a[-3:]} one step {b[-3:]}"
EOF

# Resume: 12 steps in one run, or a job that stops after 6 and one that resumes for 6 more: the same file,
# byte for byte.
run "12 steps" "$bin" "${llama[@]}" --mode ddp --batch-size 8 --max-steps 12 --save-every 12 --checkpoint "$tmp/whole.safetensors"
run "6 steps" "$bin" "${llama[@]}" --mode ddp --batch-size 8 --max-steps 12 --stop-at-step 6 --save-every 6 --checkpoint "$tmp/half.safetensors"
run "6 more" "$bin" "${llama[@]}" --mode ddp --batch-size 8 --max-steps 12 --save-every 6 --resume "$tmp/half.safetensors" --checkpoint "$tmp/resumed.safetensors"
grep -qF "resumed after step 6" <<<"$out" || { echo "FAILED: the resumed run does not say where it resumed"; fail=1; }
cmp "$tmp/whole.safetensors" "$tmp/resumed.safetensors" || { echo "FAILED: 12 steps != 6 + 6 resumed"; fail=1; }

# A resumed run keeps its configuration (Note [A run's configuration]): a changed option is refused, naming
# both values, unless --override lists it; what changed is printed.
expect 2 "--lr was '3e-3' in the checkpoint's run and is '1e-3' now" "$bin" "${base[@]/3e-3/1e-3}" --seq-len 32 \
  --mode ddp --batch-size 8 --max-steps 12 --resume "$tmp/half.safetensors"
expect 2 "--batch-size was '8' in the checkpoint's run and is '4' now" "$bin" "${llama[@]}" --mode ddp --batch-size 4 \
  --max-steps 12 --resume "$tmp/half.safetensors"
expect 0 "--lr changed from '3e-3' to '1e-3' (--override)" "$bin" "${base[@]/3e-3/1e-3}" --seq-len 32 --mode ddp \
  --batch-size 8 --max-steps 12 --resume "$tmp/half.safetensors" --override lr
# Values, not their spelling: 0.003 is the 3e-3 the checkpoint's run was given.
expect 0 "resumed after step 6" "$bin" "${base[@]/3e-3/0.003}" --seq-len 32 --mode ddp --batch-size 8 --max-steps 12 \
  --resume "$tmp/half.safetensors"
expect 2 "--override frob: not an option of dpe train" "$bin" "${llama[@]}" --mode ddp --batch-size 8 --max-steps 12 \
  --resume "$tmp/half.safetensors" --override frob
# Where it runs may change: DP resumes DDP's checkpoint.
expect 0 "resumed after step 6" "$bin" "${llama[@]}" --mode dp --batch-size 8 --max-steps 12 --resume "$tmp/half.safetensors"

# Document packing (one document per row, padded) trains too, and DP equals DDP there (Note [The loss of a
# batch with padding] in train_llm.cc).
run "document ddp" "$bin" "${llama[@]}" --mode ddp --packing document --batch-size 8 --max-steps 5 --json "$tmp/doc_ddp.json"
run "document dp" "$bin" "${llama[@]}" --mode dp --packing document --batch-size 8 --max-steps 5 --json "$tmp/doc_dp.json"
python3 - "$tmp/doc_dp.json" "$tmp/doc_ddp.json" <<'EOF' || fail=1
import json, sys
a, b = ([float(s["train_loss"]) for s in json.load(open(f))["steps"]] for f in sys.argv[1:])
assert max(abs(x - y) for x, y in zip(a, b)) < 2e-4, f"document dp {a} ddp {b}"
EOF

# Bad inputs: each refused at start-up, naming the value.
expect 2 "--max-steps applies to --model llama only" "$bin" train --model mlp --max-steps 5
expect 2 "--epochs applies to the epoch-based models" "$bin" "${llama[@]}" --epochs 3
expect 2 "--seq-len 100 is longer than the tiny preset's 64 positions" "$bin" "${base[@]}" --seq-len 100
expect 2 "num_heads 4 is not divisible by num_kv_heads 3" "$bin" "${llama[@]}" --kv-heads 3
expect 2 "--warmup-steps 10 must be below --max-steps 10" "$bin" "${llama[@]}" --max-steps 10 --warmup-steps 10
expect 2 "--data: the llama model trains on token shards" "$bin" train --model llama
expect 2 "no file named *_train_*.bin in $tmp" "$bin" train --model llama --data "$tmp"
exit $fail
