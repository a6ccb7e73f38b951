#!/usr/bin/env bash
# Bad data and bad setups (issue 19): `tandem run` on the CPU against the
# shipped tiny target (config/default/target: V 2048, 8 layers) and a small
# synthetic data set, each time with one thing wrong.  Every one must stop
# before a step is trained on it, with an error naming the file and the
# field; none may be retried.
#   0. the setup itself trains (3 steps), so the failures below are the
#      faults' and nothing else's;
#   1. one flipped low bit in a shard's token (a valid id, valid counts):
#      the shard's sha256 (checked by the prefetch before its first batch);
#   2. a truncated shard;
#   3. a token id past the vocabulary in a shard whose sha256 matches;
#   4. a manifest whose tokenizer is not the target's (vocab_size; eos);
#   5. drafter.mask_token_id outside the embedding, a tap layer past the
#      target's layers, a target with attention biases, scaled RoPE or a
#      context shorter than data.seq_len: config errors before any actor
#      starts (exit 2; as is a manifest of another tokenizer, 4); a
#      mask id the data holds: the shard check stops the run (exit 1, a
#      failure while running, as tandem.bad_input);
#   5b. legal data that cannot train as asked: every token masked out of
#      the loss (exit 2, before anything starts); samples longer than
#      data.seq_len (trained, cut to a row, the cut said at start);
#   6. a truncated target weights file: stops at once with the error, no
#      restart with backoff (the drafter would be retried four times before).
# What trained is read from metrics.jsonl (no "step" event: nothing was
# trained); only the error text is read from stderr.  About 30 s on the
# 2-core development machine alone, 40 s under ctest -j2 (each of the 13
# runs loads the tiny target once); the ctest TIMEOUT is 120 s.
set -euo pipefail
tandem="$1"; python="$2"; source_dir="$3"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT; echo "work: $work"
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }

target="$source_dir/config/default/target"
fresh_data() { rm -rf "$work/data"; "$python" "$here/make_run_dataset.py" "$work/data"; }
cat > "$work/run.toml" <<EOF
[model]
target = "$target"
[drafter]
layers = 1
block_size = 8
mask_token_id = 2047
[data]
path = "$work/data"
seq_len = 256
anchors = 16
[train]
max_steps = 3
log_every = 1
[metrics]
progress = false
[supervision]
backoff_s = [3.0]
EOF

# run NAME [ARGS...]: exit status in $rc, stderr+stdout in $work/NAME.log,
# seconds taken in $secs.
run() {
  local name=$1; shift
  local t0=$SECONDS
  rc=0
  timeout 60 "$tandem" run "$work/run.toml" --set run.output_dir="$work/$name" \
    --set placement.targets=cpu --set placement.drafters=cpu "$@" > "$work/$name.log" 2>&1 || rc=$?
  secs=$((SECONDS - t0))
}
steps_trained() {  # "step" events in NAME's metrics.jsonl (0 without one)
  local f="$work/$1/metrics.jsonl"
  [[ -f "$f" ]] || { echo 0; return; }
  "$python" -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l)["event"] == "step"))' "$f"
}
events() {  # NAME KIND: how many KIND events
  local f="$work/$1/metrics.jsonl"
  [[ -f "$f" ]] || { echo 0; return; }
  "$python" -c 'import json,sys; print(sum(1 for l in open(sys.argv[1]) if l.strip() and json.loads(l)["event"] == sys.argv[2]))' "$f" "$2"
}
says() { grep -qF -- "$2" "$work/$1.log" || { echo "--- $1.log lacks: $2"; tail -n 5 "$work/$1.log"; return 1; }; }
stopped_untrained() {  # NAME: failed (non-zero), trained nothing
  local name=$1
  [[ $rc -ne 0 ]] || { echo "--- $name exited 0"; tail -n 5 "$work/$name.log"; return 1; }
  [[ $(steps_trained "$name") -eq 0 ]] || { echo "--- $name trained $(steps_trained "$name") steps"; return 1; }
}
shard="$work/data/shard-00000.safetensors"

# 0. The setup trains.
fresh_data
run good
check test "$rc" -eq 0
check test "$(steps_trained good)" -eq 3
[[ $rc -eq 0 ]] || tail -n 20 "$work/good.log"

# 1. One flipped low bit in the first token of sample 10 (a valid id).
fresh_data
expected=$("$python" -c 'import json,sys; print(json.load(open(sys.argv[1]))["shards"][0]["sha256"])' "$work/data/manifest.json")
flip_sample_10() {
"$python" - "$shard" <<'EOF'
import json, struct, sys
path = sys.argv[1]
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = 8 + n
    offsets_at = data + header["offsets"]["data_offsets"][0]
    tokens_at = data + header["tokens"]["data_offsets"][0]
    f.seek(offsets_at + 8 * 10)
    start = struct.unpack("<q", f.read(8))[0]
    f.seek(tokens_at + 4 * start)
    token = struct.unpack("<i", f.read(4))[0]
    assert 0 < token ^ 1 < 512, token
    f.seek(tokens_at + 4 * start)
    f.write(struct.pack("<i", token ^ 1))
EOF
}
flip_sample_10
actual=$(sha256sum "$shard" | cut -d' ' -f1)
run flipped
check stopped_untrained flipped
check says flipped "$shard: sha256 is $actual but manifest.json shards[0].sha256 = '$expected'"
check says flipped "prefetch 0"

# The same bit flipped in place while a run trains on the shard (its
# mapping shows the new bytes): the next batch from it is refused, naming
# the file; the run stops, nothing trained on the changed bytes.
fresh_data
run_bg() { timeout 120 "$tandem" run "$work/run.toml" --set run.output_dir="$work/$1" --set placement.targets=cpu \
             --set placement.drafters=cpu --set train.max_steps=0 --set data.epochs=500 "${@:2}" > "$work/$1.log" 2>&1; }
rc=0; run_bg inplace & bg=$!
for _ in $(seq 300); do (( $(steps_trained inplace) >= 5 )) && break; sleep 0.1; done
flip_sample_10
wait $bg || rc=$?
check test "$rc" -ne 0
check says inplace "$shard: was modified in place while training read it"

# 2. A truncated shard: refused when the data set is opened.
fresh_data
size=$(stat -c %s "$shard"); truncate -s $((size - 100)) "$shard"
run truncated
check stopped_untrained truncated
check says truncated "$shard:"
check says truncated "truncated"

# 3. A token id past the vocabulary, in a shard whose sha256 matches (as a
# buggy writer would leave it): refused on the host, naming the sample.
fresh_data
"$python" - "$work/data" <<'EOF'
import hashlib, json, os, struct, sys
d = sys.argv[1]; path = os.path.join(d, "shard-00000.safetensors")
with open(path, "r+b") as f:
    n = struct.unpack("<Q", f.read(8))[0]
    header = json.loads(f.read(n))
    data = 8 + n
    f.seek(data + header["offsets"]["data_offsets"][0] + 8 * 5)
    start = struct.unpack("<q", f.read(8))[0]
    f.seek(data + header["tokens"]["data_offsets"][0] + 4 * (start + 3))
    f.write(struct.pack("<i", 600))  # the manifest's vocab_size is 512
m = json.load(open(os.path.join(d, "manifest.json")))
m["shards"][0]["sha256"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
m.pop("content_hash")
json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
EOF
run past_vocab
check stopped_untrained past_vocab
check says past_vocab "$shard: tokens["
check says past_vocab "] = 600 is not in [0, tokenizer.vocab_size = 512) (sample 5 of the shard, global id 5, position 3 in it)"

# 4. A manifest tokenized for another model: a larger vocabulary, another eos.
fresh_data
"$python" - "$work/data/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1])); m["tokenizer"]["vocab_size"] = 151669
json.dump(m, open(sys.argv[1], "w"))
EOF
run vocab
check test "$rc" -eq 2  # before anything starts or is written
check test ! -e "$work/vocab/metrics.jsonl"
check says vocab "$work/data/manifest.json: tokenizer.vocab_size = 151669 but $target/config.json has vocab_size = 2048"
fresh_data
"$python" - "$work/data/manifest.json" <<'EOF'
import json, sys
m = json.load(open(sys.argv[1]))
m["tokenizer"].update({"eos_token_id": 5, "bos_token_id": None, "pad_token_id": None})
json.dump(m, open(sys.argv[1], "w"))
EOF
run eos
check test "$rc" -eq 2
check says eos "$work/data/manifest.json: tokenizer.eos_token_id = 5 but $target/config.json has eos_token_id = 2046"
# An old manifest (no special tokens recorded): a warning; it trains.
fresh_data
run old_manifest
check test "$rc" -eq 0
check says old_manifest "records no special token ids"

# 5. Config values that index past the target: exit 2 before any actor.
run mask --set drafter.mask_token_id=2048
check test "$rc" -eq 2
check says mask "$work/run.toml: 'drafter.mask_token_id' = 2048 is not a row of the target's embedding: $target/config.json has vocab_size = 2048"
check test ! -e "$work/mask/metrics.jsonl"
# Sizes too large to plan a batch with: named, exit 2 (it was "std::bad_alloc", exit 1).
run lookahead --set data.lookahead=1000000000000000
check test "$rc" -eq 2
check says lookahead "$work/run.toml: data.rows = 1 and data.lookahead = 1000000000000000: one batch's packing does not fit in memory"
check test ! -e "$work/lookahead/metrics.jsonl"
# A target Tandem cannot run as written, or whose context is shorter than
# data.seq_len: exit 2, naming config.json and the field, nothing written.
odd_target() {  # NAME PYTHON-EDIT: a copy of the target with its config.json edited
  mkdir -p "$work/t_$1"; cp -r "$target"/. "$work/t_$1"/
  "$python" -c "import json,sys; p=sys.argv[1]; c=json.load(open(p)); $2; json.dump(c, open(p, 'w'))" "$work/t_$1/config.json"
}
odd_target bias 'c["attention_bias"] = True'
run bias --set model.target="$work/t_bias"
check test "$rc" -eq 2
check says bias "$work/t_bias/config.json: field 'attention_bias' is true"
odd_target short 'c["max_position_embeddings"] = 128'
run short --set model.target="$work/t_short"
check test "$rc" -eq 2
check says short "data.seq_len = 256 is longer than the target's context: $work/t_short/config.json has max_position_embeddings = 128"
odd_target scaled 'c["rope_scaling"] = {"rope_type": "linear", "factor": 2.0}'
run scaled --set model.target="$work/t_scaled"
check test "$rc" -eq 2
check says scaled "field 'rope_scaling.rope_type' is \"linear\""
check test ! -e "$work/scaled/metrics.jsonl"
check test ! -e "$work/mask/config.toml"  # nothing written before the checks pass
# A mask id the data holds: the shard check stops the run before it trains.
fresh_data
used=$("$python" -c 'import sys; from safetensors.numpy import load_file; print(int(load_file(sys.argv[1])["tokens"][0]))' "$shard")
run mask_in_data --set drafter.mask_token_id="$used"
check stopped_untrained mask_in_data
check test "$rc" -eq 1  # found after the actors started: a failure while running
check says mask_in_data "tandem run failed: tandem.bad_input"  # (was labelled device_failure)
check says mask_in_data "$shard: tokens[0] = $used is drafter.mask_token_id: the drafter's mask token must never occur in the data"
run taps --set model.tap_layers=1,4,8
check test "$rc" -eq 2
check says taps "$work/run.toml: 'model.tap_layers[2]' = 8 is not a layer of the target: $target/config.json has num_hidden_layers = 8"
check test ! -e "$work/taps/metrics.jsonl"

# 5b. Legal data that cannot train as asked.  Every token masked out of the
# loss (a data set prepared with --min-supervised 0): exit 2 before anything
# starts, naming the manifest (it trained every step on nothing, "no loss",
# exit 0).  Samples longer than data.seq_len: trained on, cut to a row, and
# how much is cut is said (it was counted by the packer and never shown).
fresh_data
"$python" - "$work/data" <<'EOF'
import hashlib, json, os, sys
from safetensors.numpy import load_file, save_file
d = sys.argv[1]; path = os.path.join(d, "shard-00000.safetensors")
t = load_file(path); t["loss_mask"][:] = 0
save_file(t, path, metadata={"format": "tandem.shard.v1", "num_samples": str(len(t["offsets"]) - 1),
                             "num_tokens": str(len(t["tokens"]))})
m = json.load(open(os.path.join(d, "manifest.json")))
m["shards"][0]["sha256"] = hashlib.sha256(open(path, "rb").read()).hexdigest()
m["shards"][0]["num_supervised"] = m["totals"]["supervised"] = 0
m["content_hash"] = hashlib.sha256(m["shards"][0]["sha256"].encode()).hexdigest()
json.dump(m, open(os.path.join(d, "manifest.json"), "w"))
EOF
run all_masked
check test "$rc" -eq 2
check test ! -e "$work/all_masked/metrics.jsonl"
check says all_masked "$work/run.toml: data.path: $work/data/manifest.json: totals.supervised = 0: every token of its 64 samples is masked out of the loss"
fresh_data
cut=$("$python" -c 'import sys; from safetensors.numpy import load_file; import numpy as np
n = np.diff(load_file(sys.argv[1])["offsets"]); print(int((n > 128).sum()), int(np.maximum(n - 128, 0).sum()), int(n.max()))' "$shard")
read -r cut_samples cut_tokens longest <<< "$cut"
run long_samples --set data.seq_len=128
check test "$rc" -eq 0
check test "$(steps_trained long_samples)" -eq 3
check test "$cut_samples" -gt 0
check says long_samples "warning: $cut_samples of 64 samples are longer than data.seq_len = 128 (the longest has $longest tokens): each keeps its first 128 tokens, and $cut_tokens tokens"

# 6. A truncated target weights file: the run stops at once with the error
# naming the file; no drafter restart (backoff_s is 3 s: the three restarts
# the budget allows would take 9 s and more).
mkdir -p "$work/target"
cp "$target/config.json" "$work/target/"
head -c 100000 "$target/model.safetensors" > "$work/target/model.safetensors"
sed -i "s|^target = .*|target = \"$work/target\"|" "$work/run.toml"
run truncated_target
check stopped_untrained truncated_target
check test "$rc" -eq 1
check says truncated_target "tandem run failed: tandem.bad_input"
check says truncated_target "$work/target/model.safetensors"
check says truncated_target "truncated"
check test "$(events truncated_target drafter_restarted)" -eq 0
check test "$secs" -lt 8
echo "truncated target: exit $rc after ${secs} s, $(events truncated_target drafter_failed) drafter failure(s) recorded"

echo "bad_data_test: $passed passed, $failed failed"
[[ $failed -eq 0 ]]
