# Sourced by run_test.sh and dp_run_test.sh (after they set tandem, python,
# fixtures and here): a work folder, the pass/fail counters, the tiny run's
# data set and config, and the readers of a run's metrics.jsonl.
work=$(mktemp -d); [[ -n "${KEEP_WORK:-}" ]] || trap 'rm -rf "$work"' EXIT; echo "work: $work"
fail() { echo "FAIL: $*"; exit 1; }
passed=0; failed=0
check() { if "$@"; then passed=$((passed+1)); else failed=$((failed+1)); echo "FAILED: $*"; fi; }

"$python" "$here/make_run_dataset.py" "$work/data"
sed "s|@TARGET@|$fixtures/qwen3_tiny|" "$here/run_test.toml" > "$work/run.toml"

summary() { "$python" "$here/run_summary.py" "$1"; }
field() { "$python" -c 'import json,sys; print(json.loads(sys.argv[1])[sys.argv[2]])' "$1" "$2"; }
both_epochs_exact() {
  "$python" -c "import json,sys; s=json.loads(sys.argv[1]); assert s['committed_per_epoch'] == {'0': 64, '1': 64}, s" "$1"
}
