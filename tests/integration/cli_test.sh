#!/usr/bin/env bash
# The tandem executable as a user meets it:
#  - `--help` lists exactly the subcommands that exist and work, and each runs;
#  - it starts on a host without a GPU driver (no hard libcuda.so.1 link);
#  - `info --json` is one valid JSON object; `doctor` probes the CPU.
set -euo pipefail
tandem="$1"
python="${2:-python3}"
src="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
fail() { echo "FAIL: $*"; exit 1; }

# 1. No hard link-time dependency on the driver library.
if readelf -d "$tandem" | grep -q 'NEEDED.*libcuda\.so'; then
  readelf -d "$tandem" | grep NEEDED
  fail "tandem has a DT_NEEDED on libcuda.so: it would not start without a GPU driver"
fi
echo "ok: no DT_NEEDED libcuda.so"
# libtorch.so exports broken copies of std::filesystem functions; libstdc++
# must come first in the lookup order (CMakeLists.txt explains).
first=$(readelf -d "$tandem" | awk '/NEEDED/ {print $NF; exit}')
[[ "$first" == "[libstdc++.so.6]" ]] || fail "first DT_NEEDED is $first, not libstdc++.so.6"
echo "ok: libstdc++ first in DT_NEEDED"

# 2. Help lists the working subcommands, and nothing else.
expected="bench certs doctor eval export generate info node prepare run shell"
listed=$("$tandem" --help | awk '/^Subcommands:/{on=1; next} on && NF {print $1}' | sort | xargs)
[[ "$listed" == "$expected" ]] || fail "help lists '$listed', expected '$expected'"
echo "ok: --help lists: $listed"
for sub in $listed; do
  "$tandem" "$sub" --help > /dev/null || fail "$sub --help"
done
"$tandem" prepare --help | grep -q -- "--tokenizer" || fail "prepare --help does not show the script's options"

# eval / export / generate refuse bad input with exit 2, naming the path (they run for
# real in tests/decode/).
empty=$(mktemp -d)
out=$("$tandem" export "$empty" --out "$empty/x" 2>&1) && fail "export of an empty folder succeeded" || true
grep -q "$empty" <<< "$out" || fail "export's error does not name the folder: $out"
echo '{"messages": [{"role": "user", "content": "hi"}]}' > "$empty/p.jsonl"
rc=0; out=$("$tandem" eval --drafter "$empty/none" --prompts "$empty/p.jsonl" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "$empty/none" <<< "$out" || fail "eval with a missing drafter: exit $rc, $out"
echo 'not json' > "$empty/bad.jsonl"
rc=0; out=$("$tandem" generate --target "$empty" --prompts "$empty/bad.jsonl" --out "$empty/o" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "bad.jsonl:1" <<< "$out" || fail "generate with a bad prompts file: exit $rc, $out"
# generate resumes only its own work: an --out of other prompts or options is refused.
printf '%s\n' '{"format": "tandem.prompts.v1", "stop_ids": [1]}' '{"ids": [5, 6, 7]}' > "$empty/p1.jsonl"
printf '%s\n' '{"format": "tandem.generated.v1", "prompts": 1, "max_new_tokens": 99}' \
  '{"index": 0, "tokens": [9], "hit_limit": false}' > "$empty/g.jsonl"
rc=0; out=$("$tandem" generate --target "$empty" --prompts "$empty/p1.jsonl" --out "$empty/g.jsonl" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "holds generations of other prompts or options" <<< "$out" \
  || fail "generate resumed a foreign --out: exit $rc, $out"
echo '{"index": 0, "tokens": [9], "hit_limit": false}' > "$empty/g.jsonl"
rc=0; out=$("$tandem" generate --target "$empty" --prompts "$empty/p1.jsonl" --out "$empty/g.jsonl" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "not written by tandem generate" <<< "$out" \
  || fail "generate took an --out without its header: exit $rc, $out"
rc=0; out=$("$tandem" generate --target "$empty" --prompts "$empty/p1.jsonl" --out "$empty/g2.jsonl" \
  --temperature 1 --top-p 0 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q -- "--top-p: must be in (0, 1\] (1: off), got 0$" <<< "$out" && [[ ! -e "$empty/g2.jsonl" ]] || fail "generate took --top-p 0 (or stamped its --out): exit $rc, $out"
# Each option is named as the user typed it, with the value as typed (not "top_p ... got 0.000000").
# A drafter that passes the first checks (its config only: nothing gets as far as its weights).
mkdir -p "$empty/drafter"
cat > "$empty/drafter/config.json" <<'JSON'
{"architectures": ["DFlashDraftModel"], "block_size": 16, "num_target_layers": 36,
 "dflash_config": {"mask_token_id": 151669, "target_layer_ids": [1, 9, 17, 25, 33]},
 "hidden_size": 4096, "intermediate_size": 12288, "num_hidden_layers": 5, "num_attention_heads": 32,
 "num_key_value_heads": 8, "head_dim": 128, "rms_norm_eps": 1e-06, "rope_theta": 1000000,
 "vocab_size": 151936, "tie_word_embeddings": false, "max_position_embeddings": 40960, "model_type": "qwen3"}
JSON
target="$src/config/default/target" tok="$src/config/default/tokenizer"
expect2() {  # expect2 WHAT TEXT CMD...: exit 2 and TEXT (a fixed string) in the output
  local what="$1" text="$2" rc=0 out; shift 2
  out=$("$@" 2>&1) || rc=$?
  [[ $rc == 2 ]] && grep -qF -- "$text" <<< "$out" || fail "$what: exit $rc, $out"
}
e=(eval --drafter "$empty/drafter" --prompts "$empty/p.jsonl")
g=(generate --target "$target" --prompts "$empty/p1.jsonl" --out "$empty/g3.jsonl")
expect2 "eval --top-p 1.5" "--top-p: must be in (0, 1] (1: off), got 1.5" "$tandem" "${e[@]}" --temperature 1 --top-p 1.5
expect2 "generate --top-p 1e-400" "--top-p: must be in (0, 1] (1: off), got 1e-400" "$tandem" "${g[@]}" --top-p 1e-400
# A path that names nothing is named with its option (was "/x: no such file").
expect2 "eval --target missing" "--target: Directory does not exist: $empty/missing" \
  "$tandem" "${e[@]}" --target "$empty/missing" --tokenizer "$tok"
expect2 "eval --tokenizer missing" "--tokenizer: Directory does not exist: $empty/missing" \
  "$tandem" "${e[@]}" --target "$target" --tokenizer "$empty/missing"
expect2 "eval --tokenizer without tokenizer.json" "no tokenizer.json in $empty (--tokenizer)" \
  "$tandem" "${e[@]}" --target "$target" --tokenizer "$empty"
expect2 "export --target missing" "--target: Directory does not exist: $empty/missing" \
  "$tandem" export "$empty/drafter" --out "$empty/x" --target "$empty/missing"
expect2 "generate --target missing" "--target: Directory does not exist: $empty/missing" \
  "$tandem" generate --target "$empty/missing" --prompts "$empty/p1.jsonl" --out "$empty/g3.jsonl"
expect2 "generate --out in a missing folder" "--out: no folder $empty/missing for $empty/missing/g.jsonl" \
  "$tandem" generate --target "$target" --prompts "$empty/p1.jsonl" --out "$empty/missing/g.jsonl"
expect2 "prepare --tokenizer missing" "--tokenizer $empty/missing does not exist" \
  "$tandem" prepare --tokenizer "$empty/missing" --output "$empty/data" "$empty/p.jsonl"
expect2 "prepare --prompts-out in a missing folder" "--prompts-out $empty/missing/p.jsonl: no folder" \
  "$tandem" prepare --tokenizer "$tok" --prompts-out "$empty/missing/p.jsonl" "$empty/p.jsonl"
echo "keep = 1" > "$empty/mine.toml"  # a file of the user's at --prompts-out stays unless --overwrite
expect2 "shell --ca missing" "--ca $empty/none.pem: cannot read it" \
  "$tandem" shell 127.0.0.1:1 --token-file "$empty/mine.toml" --ca "$empty/none.pem" -c status
expect2 "prepare --prompts-out over another file" "--prompts-out $empty/mine.toml exists and is not a prompts file" \
  "$tandem" prepare --tokenizer "$tok" --prompts-out "$empty/mine.toml" "$empty/p.jsonl"
[[ "$(cat "$empty/mine.toml")" == "keep = 1" ]] || fail "a refused prepare --prompts-out replaced the file there"
[[ ! -e "$empty/missing" ]] || fail "a refused command made $empty/missing"
# A seed is a UINT: -1 is refused, not taken as 2^64 - 1.
expect2 "eval --seed -1" "--seed: must be at least 0, got -1" "$tandem" "${e[@]}" --seed -1
expect2 "generate --seed -1" "--seed: must be at least 0, got -1" "$tandem" "${g[@]}" --seed -1
[[ ! -e "$empty/g3.jsonl" ]] || fail "a refused generate wrote its --out"
# Prompts that are not JSONL: a usage error (2), naming the file and line (was exit 1).
expect2 "eval with prompts that are not JSONL" "bad.jsonl:1: invalid JSON" \
  "$tandem" eval --drafter "$empty/drafter" --prompts "$empty/bad.jsonl" --target "$target" --tokenizer "$tok" --device cpu
# export never writes into a folder that holds something (a target, a checkpoint) unless told.
mkdir -p "$empty/full" && echo '{}' > "$empty/full/config.json"
rc=0; out=$("$tandem" export "$empty" --out "$empty/full" 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "is not empty" <<< "$out" && grep -q '^{}$' "$empty/full/config.json" \
  || fail "export into a non-empty folder: exit $rc, $out"
rc=0; out=$("$tandem" bench --device gpu 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "not one of cpu, cuda, cuda:N, auto" <<< "$out" || fail "bench --device gpu: exit $rc, $out"
# doctor --device follows bench's convention: -1 is the CPU (said in --help), below it refused.
"$tandem" doctor --help | grep -qF -- "(-1: the CPU)" || fail "doctor --help does not say that --device -1 is the CPU"
rc=0; out=$("$tandem" doctor --device -2 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -qF -- "--device: must be at least -1, got -2" <<< "$out" || fail "doctor --device -2: exit $rc, $out"
rc=0; out=$("$tandem" doctor --cpu --timeout 0 2>&1) || rc=$?
[[ $rc != 0 ]] && grep -q -- "--timeout: must be from 0.001 to 86400 seconds, got 0" <<< "$out" || fail "doctor --timeout 0: exit $rc, $out"
# A shell that can never connect (HOST:PORT without a token) leaves at once, --follow or not.
rc=0; out=$(TANDEM_TOKEN= timeout 20 "$tandem" shell 127.0.0.1:1 --follow 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "needs the run's token" <<< "$out" || fail "shell HOST:PORT --follow without a token: exit $rc, $out"
# A port out of range is named, not read as a run folder (no control.json to wait for with --follow).
rc=0; out=$(TANDEM_TOKEN=x timeout 20 "$tandem" shell 127.0.0.1:99999 --follow -c status 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "port 99999 is out of range (1..65535)" <<< "$out" \
  || fail "shell 127.0.0.1:99999: exit $rc, $out"
rc=0; out=$(TANDEM_TOKEN=x timeout 20 "$tandem" shell localhost:0 -c status 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "port 0 is out of range" <<< "$out" || fail "shell localhost:0: exit $rc, $out"
# `tandem shell --help` states its exit statuses (docs/control.md says the same).
out=$("$tandem" shell --help)
grep -q "2  misuse: a command unknown or malformed" <<< "$out" || fail "shell --help: no exit statuses"
# An A/B knob with a value it does not know is refused, naming the variable.
knob=$(mktemp -d)
printf '%s\n' '{"format": "tandem.prompts.v1", "stop_ids": [1]}' '{"ids": [5, 6, 7]}' > "$knob/p.jsonl"
rc=0; out=$(TANDEM_TARGET_ATTENTION=bogus "$tandem" generate --target "$src/config/default/target" \
  --prompts "$knob/p.jsonl" --out "$knob/g.jsonl" --max-new-tokens 2 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q "TANDEM_TARGET_ATTENTION='bogus' is not one of auto, flash2" <<< "$out" \
  || fail "TANDEM_TARGET_ATTENTION=bogus: exit $rc, $out"
rm -rf "$knob"
# TANDEM_PYTHON may name an interpreter on PATH, as a shell would find it.
py=$(TANDEM_PYTHON= "$tandem" info --json 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin).get("python",""))' 2>/dev/null || true)
if [[ -x "$py" ]]; then
  rc=0; out=$(PATH="$(dirname "$py"):$PATH" TANDEM_PYTHON="$(basename "$py")" "$tandem" prepare --help 2>&1) || rc=$?
  [[ $rc == 0 ]] && grep -q "usage: tandem prepare" <<< "$out" || fail "TANDEM_PYTHON=$(basename "$py") (on PATH): exit $rc, $out"
fi
rm -rf "$empty"
# A number out of range on the command line: said plainly, exit 2 (a usage error, as
# every other), not CLI11's 105 with the whole double range printed.
rng=$(mktemp -d)
printf '%s\n' '{"format": "tandem.prompts.v1", "stop_ids": [1]}' '{"ids": [5, 6, 7]}' > "$rng/p.jsonl"
rc=0; out=$("$tandem" generate --target "$rng" --prompts "$rng/p.jsonl" --out "$rng/g.jsonl" --batch 0 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q -- "--batch: must be at least 1, got 0" <<< "$out" || fail "generate --batch 0: exit $rc, $out"
rm -rf "$rng"
rc=0; out=$("$tandem" bench --seconds 0 prefetch_pack 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q -- "--seconds: must be more than 0, got 0" <<< "$out" || fail "bench --seconds 0: exit $rc, $out"
rc=0; "$tandem" run --no-such-option > /dev/null 2>&1 || rc=$?
[[ $rc == 2 ]] || fail "an unknown option: exit $rc"
# --resume and --overwrite contradict each other (together, --overwrite was ignored).
rc=0; out=$("$tandem" run "$src/config/default.toml" --resume --overwrite 2>&1) || rc=$?
[[ $rc == 2 ]] && grep -q -- "--resume excludes --overwrite" <<< "$out" || fail "run --resume --overwrite: exit $rc, $out"
echo "ok: eval, export and generate name what is wrong"

# 3. Each subcommand works.
"$tandem" --version | grep -q '^tandem ' || fail "--version"
json=$("$tandem" info --json)
python3 -c 'import json,sys; j=json.loads(sys.argv[1]); assert j["libtorch"].startswith("2.11"), j; assert j["caf"]=="0.17.6", j' "$json" \
  || fail "info --json: $json"
echo "ok: info --json: $json"
"$tandem" doctor --cpu --json | tee /dev/stderr | python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
assert lines and all(l["ok"] for l in lines), lines
assert any(l["device"] == "cpu" for l in lines), lines' || fail "doctor --cpu"
echo "ok: doctor"
"$tandem" bench target_forward drafter_step_eager drafter_step --size tiny --warmup 0 --iters 1 --profile-steps 0 \
  --rows 3 --device cpu | python3 -c '
import json, sys
lines = [json.loads(l) for l in sys.stdin if l.strip()]
names = sorted(l["case"] for l in lines)
# On the CPU: no "graphed" drafter_step line, no graph pool (no graphs there).
assert names == ["drafter_step", "drafter_step_eager"] + ["target_forward"] * 5, names
assert [l["mode"] for l in lines if l["case"] == "drafter_step"] == ["eager"], lines
assert all(l["graph_pool_gib"] is None for l in lines if l["case"] == "target_forward" and "graph_pool_gib" in l), lines
variants = sorted(l["variant"] for l in lines if l["case"] == "target_forward")
assert all(l["shapes"]["batch"] == 3 for l in lines if l["case"] == "target_forward"), lines  # --rows
assert variants == ["causal_sdpa", "eager", "graphs", "graphs_1doc", "mask"], variants
for l in lines:
    assert l["schema"] == 1 and l["median_ms"] > 0 and l["tflop"] > 0 and 0 < l["mfu"] < 1, l
print("ok: bench", [(l["case"], round(l["median_ms"], 1)) for l in lines])' || fail "bench"
if "$tandem" bench nosuchcase 2> /dev/null; then fail "unknown bench case accepted"; fi

# 4. prepare -> shards -> the C++ reader and packer (bench prefetch_pack --dataset).
work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
"$python" "$src/tools/prepare/make_test_tokenizer.py" "$work/tok" > /dev/null
"$python" - "$work/chat.jsonl" <<'PY'
import json, sys
with open(sys.argv[1], "w") as f:
    for i in range(60):
        f.write(json.dumps({"messages": [
            {"role": "user", "content": f"Write function number {i} for me."},
            {"role": "assistant", "content": f"def function_{i}(x):\n    return x * {i} + sum(range({i}))\n" * 3}]}) + "\n")
    f.write("this line is not json\n")
PY
"$tandem" prepare --tokenizer "$work/tok" --output "$work/data" --block-size 4 "$work/chat.jsonl" 2> "$work/prepare.err" \
  || { cat "$work/prepare.err"; fail "prepare"; }
grep -q "chat.jsonl:61" "$work/prepare.err" || { cat "$work/prepare.err"; fail "prepare did not report the bad line with file:line"; }
"$tandem" bench prefetch_pack --dataset "$work/data" --seconds 0.5 | "$python" -c '
import json, sys
l = json.loads(sys.stdin.read())
assert l["case"] == "prefetch_pack" and l["samples_per_s"] > 0 and l["dataset"] != "synthetic", l
print("ok: prepare -> shards -> packer:", round(l["samples_per_s"]), "samples/s,", round(l["tokens_per_s"]), "tokens/s")' \
  || fail "bench prefetch_pack on the prepared dataset"

# 4. A bad argument is an error with a message, not a crash.
if "$tandem" doctor --device notanumber 2> /tmp/tandem_cli_err.$$; then fail "bad --device accepted"; fi
grep -qi "device" /tmp/tandem_cli_err.$$ || fail "bad --device message does not name the option"
rm -f /tmp/tandem_cli_err.$$
# 5. An unknown subcommand is named, with the nearest one; never the main help and 0.
if "$tandem" rnu 2> /tmp/tandem_cli_err.$$; then fail "unknown subcommand accepted"; fi
grep -q "unknown command 'rnu' (did you mean 'run'?)" /tmp/tandem_cli_err.$$ \
  || { cat /tmp/tandem_cli_err.$$; fail "unknown subcommand message"; }
if "$tandem" nosuchthing --help > /tmp/tandem_cli_out.$$ 2>&1; then fail "UNKNOWN --help exits 0"; fi
grep -q "unknown command 'nosuchthing'" /tmp/tandem_cli_out.$$ || fail "UNKNOWN --help does not name it"
rm -f /tmp/tandem_cli_err.$$ /tmp/tandem_cli_out.$$
echo "ok: unknown subcommands"
echo "cli: all checks passed"
