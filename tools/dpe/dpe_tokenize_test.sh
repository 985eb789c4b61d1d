#!/usr/bin/env bash
# `dpe tokenize` end to end on generated text: the tokenizer and the llm.c shards are written (headers, counts,
# token ranges, BOS/EOS per document, the validation rule, the shard size cap), a second run writes the same
# bytes, --force replaces an earlier run; each bad input gives its exit status and message, before any work.
set -uo pipefail
bin="$1"
tmp="${TEST_TMPDIR:-$(mktemp -d)}/dpe_tokenize_test"
rm -rf "$tmp" && mkdir -p "$tmp"
source "$(dirname "$0")/test_lib.sh"
fail=0

# Two files of paragraphs (blank-line separated) and fortune entries (%-separated), words from a fixed
# generator, a few UTF-8 characters; CRLF line ends in the second file.
python3 - "$tmp" <<'EOF'
import random, sys
d = sys.argv[1]
rng = random.Random(1)
words = ("the of and to in is was he for it with as his on be at by had that from this not are but which or "
         "have an they were one all been their has there would when who will more no if out so said what up its "
         "about into than them can only other new some could time these two may then do first any my now such "
         "like our over man me even most made after also did many before must through back years where much your "
         "way well down should because each just those people how too little state good very make world still "
         "own see men work long get here between both life being under never day same another know while last "
         "might us great old year off come since against go came right used take three").split()
def paragraph():
    lines = []
    for _ in range(rng.randint(1, 4)):
        line = " ".join(rng.choice(words) for _ in range(rng.randint(4, 12)))
        lines.append(line[0].upper() + line[1:] + rng.choice([".", ",", ";", "!", "?", ". 1984", " (café)"]))
    return "\n".join(lines)
with open(f"{d}/prose.txt", "w", newline="") as f:
    f.write("\n\n".join(paragraph() for _ in range(150)) + "\n")
with open(f"{d}/fortunes.txt", "w", newline="") as f:
    f.write("\r\n%\r\n".join(paragraph().replace("\n", "\r\n") for _ in range(60)) + "\r\n%\r\n")
# Many distinct characters: too many for a vocabulary of 261 pieces.
with open(f"{d}/symbols.txt", "w") as f:
    f.write("\n\n".join(" ".join(chr(c) * 3 for c in range(33, 127)) for _ in range(3)) + "\n")
with open(f"{d}/one_document.txt", "w") as f:
    f.write("a single paragraph\nof two lines\n")
EOF

tokenize() { timeout 120 "$bin" tokenize "$@"; }

# The command works: 210 documents (150 paragraphs, 60 entries), every 4th from the 2nd to validation.
run "tokenize" tokenize --input "$tmp/prose.txt" "$tmp/fortunes.txt" --vocab-size 400 --out "$tmp/out" \
  --val-fraction 0.25 --shard-tokens 3000
echo "$out" | tail -5
for want in "210 documents from 2 files" "157 train, 53 validation" "pieces (BOS 1, EOS 2, PAD 3)" \
            "tokens per byte of text"; do
  grep -qF -- "$want" <<<"$out" || { echo "FAILED: the summary lacks '$want'"; fail=1; }
done

# The files: the tokenizer (one vocabulary line per piece) and shards with llm.c's header, each train shard
# but the last holding exactly --shard-tokens tokens, every token below the vocabulary size, every document
# [BOS] ... [EOS], and the split's document counts.
python3 - "$tmp/out" <<'EOF' || fail=1
import glob, os, struct, sys
d = sys.argv[1]
problems = []
for name in ("tokenizer.model", "tokenizer.vocab"):
    if not os.path.isfile(f"{d}/{name}"):
        problems.append(f"{name} is missing")
vocab = open(f"{d}/tokenizer.vocab", encoding="utf-8").read().splitlines()
if len(vocab) != 400 or vocab[1].split("\t")[0] != "<s>" or vocab[3].split("\t")[0] != "<pad>":
    problems.append(f"tokenizer.vocab: {len(vocab)} lines, ids 1 and 3 {vocab[1:4]}")

def read_shard(path):
    blob = open(path, "rb").read()
    magic, version, count = struct.unpack("<3i", blob[:12])
    if magic != 20240520 or version != 1:
        problems.append(f"{path}: magic {magic}, version {version}; expected 20240520, 1")
    if len(blob) != 1024 + 2 * count:
        problems.append(f"{path}: {len(blob)} bytes for a count of {count}")
    return list(struct.unpack(f"<{count}H", blob[1024:1024 + 2 * count]))

docs = {}
for split in ("train", "val"):
    paths = sorted(glob.glob(f"{d}/tokens_{split}_*.bin"))
    if not paths or paths[0] != f"{d}/tokens_{split}_000000.bin":
        problems.append(f"{split}: shards {paths}")
        continue
    tokens = []
    for i, p in enumerate(paths):
        t = read_shard(p)
        if not t:
            problems.append(f"{p} is empty")
        if i < len(paths) - 1 and len(t) != 3000:
            problems.append(f"{p}: {len(t)} tokens; every shard but the last holds --shard-tokens 3000")
        tokens += t
    if split == "train" and len(paths) < 2:
        problems.append(f"train: {len(paths)} shard; expected more than one at 3000 tokens a shard")
    if max(tokens) >= 400:
        problems.append(f"{split}: token {max(tokens)} >= the vocabulary size 400")
    if tokens[0] != 1 or tokens[-1] != 2:
        problems.append(f"{split}: starts with {tokens[0]}, ends with {tokens[-1]}; expected BOS 1 ... EOS 2")
    bos, eos = tokens.count(1), tokens.count(2)
    if bos != eos or 3 in tokens or 0 in tokens:
        problems.append(f"{split}: {bos} BOS, {eos} EOS, PAD {3 in tokens}, UNK {0 in tokens}")
    docs[split] = bos
if docs != {"train": 157, "val": 53}:
    problems.append(f"documents per split {docs}; expected train 157, val 53 (documents 1, 5, 9, ... of 210)")
for p in problems:
    print("FAILED:", p)
sys.exit(1 if problems else 0)
EOF

# Reproducible: a second run writes the same bytes.
run "tokenize again" tokenize --input "$tmp/prose.txt" "$tmp/fortunes.txt" --vocab-size 400 --out "$tmp/again" \
  --val-fraction 0.25 --shard-tokens 3000
for f in "$tmp"/out/*; do
  cmp -s "$f" "$tmp/again/$(basename "$f")" || { echo "FAILED: $(basename "$f") differs between two runs"; fail=1; }
done

# An existing, non-empty --out is refused without --force; --force replaces the tokenizer and this name's
# shards (the earlier run's extra train shards go), and leaves other files alone.
touch "$tmp/out/notes.txt"
expect 2 "--out $tmp/out: the directory is not empty" \
  "$bin" tokenize --input "$tmp/prose.txt" --vocab-size 400 --out "$tmp/out"
run "tokenize --force" tokenize --input "$tmp/prose.txt" "$tmp/fortunes.txt" --vocab-size 400 --out "$tmp/out" --force
want="notes.txt tokenizer.model tokenizer.vocab tokens_train_000000.bin tokens_val_000000.bin "
[[ "$(cd "$tmp/out" && LC_ALL=C ls | tr '\n' ' ')" == "$want" ]] ||
  { echo "FAILED: after --force, $tmp/out holds: $(ls "$tmp/out" | tr '\n' ' ')"; fail=1; }
# A unigram model and a --name.
run "unigram" tokenize --input "$tmp/prose.txt" --vocab-size 360 --model-type unigram --name prose --out "$tmp/uni"
[[ -s "$tmp/uni/prose_train_000000.bin" && -s "$tmp/uni/prose_val_000000.bin" ]] || { echo "FAILED: unigram shards"; fail=1; }
expect 0 "Documents: a document is a run of lines between separators" "$bin" tokenize --help

# Bad inputs: exit status 2 (CLI11's own code for syntax), a message naming the value, nothing written.
err() { expect "$1" "$2" "$bin" tokenize "${@:3}"; }
good=(--input "$tmp/prose.txt")
err 2 "--input $tmp/none.txt: no such file" --input "$tmp/none.txt" --vocab-size 400 --out "$tmp/bad"
err 2 "--input $tmp: is not a regular file" --input "$tmp" --vocab-size 400 --out "$tmp/bad"
err 2 "--input $tmp/prose.txt and --input $tmp/./prose.txt are the same file" \
  --input "$tmp/prose.txt" "$tmp/./prose.txt" --vocab-size 400 --out "$tmp/bad"
err 2 "--vocab-size 0: expected an integer in [261, 2^24]" "${good[@]}" --vocab-size 0 --out "$tmp/bad"
err 2 "--vocab-size 260: expected an integer in [261, 2^24]" "${good[@]}" --vocab-size 260 --out "$tmp/bad"
err 2 "--vocab-size 99999999999: expected an integer in [261, 2^24]" "${good[@]}" --vocab-size 99999999999 --out "$tmp/bad"
err 106 "--vocab-size is required" "${good[@]}" --out "$tmp/bad"
err 2 "--val-fraction 0.7: expected a number in (0, 0.5]" "${good[@]}" --vocab-size 400 --out "$tmp/bad" --val-fraction 0.7
err 2 "--val-fraction 0: expected a finite number > 0" "${good[@]}" --vocab-size 400 --out "$tmp/bad" --val-fraction 0
err 2 "--shard-tokens 0: expected an integer in [1, 2147483647]" \
  "${good[@]}" --vocab-size 400 --out "$tmp/bad" --shard-tokens 0
err 105 "--model-type: frob not in" "${good[@]}" --vocab-size 400 --out "$tmp/bad" --model-type frob
err 2 "--name 'a/b': expected 1 to 100 letters" "${good[@]}" --vocab-size 400 --out "$tmp/bad" --name a/b
err 2 "--name 'x_val': the shard names" "${good[@]}" --vocab-size 400 --out "$tmp/bad" --name x_val
err 2 "--out $tmp/no/such: the directory $tmp/no does not exist (create it first)" \
  "${good[@]}" --vocab-size 400 --out "$tmp/no/such"
err 2 "--out $tmp/prose.txt: is not a directory" "${good[@]}" --vocab-size 400 --out "$tmp/prose.txt"
[[ ! -e "$tmp/bad" ]] || { echo "FAILED: a refused command left $tmp/bad"; fail=1; }
# Out directory not writable: a directory without write permission, or (root passes permission checks) a
# sysfs directory where creating a file fails even for root; skipped where neither exists.
if [[ $(id -u) -ne 0 ]]; then
  mkdir -p "$tmp/readonly" && chmod 555 "$tmp/readonly"
  err 2 "--out $tmp/readonly: the directory is not writable" "${good[@]}" --vocab-size 400 --out "$tmp/readonly"
  err 2 "--out $tmp/readonly/new: cannot create the directory" "${good[@]}" --vocab-size 400 --out "$tmp/readonly/new"
  chmod 755 "$tmp/readonly"
elif [[ -d /sys/kernel ]] && ! touch /sys/kernel/dpe_probe 2>/dev/null; then
  err 2 "--out /sys/kernel: the directory is not writable" "${good[@]}" --vocab-size 400 --out /sys/kernel
else
  rm -f /sys/kernel/dpe_probe 2>/dev/null
  echo "skipped: no unwritable directory to try as root"
fi
# Refused after reading the text, before training: fewer than 2 documents.
err 2 "--input $tmp/one_document.txt: 1 document in 32 bytes; expected at least 2" \
  --input "$tmp/one_document.txt" --vocab-size 400 --out "$tmp/one"
# Refused by SentencePiece: 261 pieces cannot hold 95 characters (94 symbols and SentencePiece's space mark)
# beside the 260 special and byte pieces, and the text has fewer merges than 100000 pieces need.
err 2 "Tokenizer::train: SentencePiece could not train a 261-piece bpe model on $tmp/symbols.txt: Internal:" \
  --input "$tmp/symbols.txt" --vocab-size 261 --out "$tmp/small"
grep -qF "Vocabulary size is smaller than required_chars. 261 vs 355" <<<"$out" || { echo "FAILED: $out"; fail=1; }
err 2 "Vocabulary size too high (100000)" "${good[@]}" --vocab-size 100000 --out "$tmp/big"
[[ ! -e "$tmp/big/tokenizer.model" ]] || { echo "FAILED: a failed training left a model"; fail=1; }
exit $fail
