# On the GPU host (issue 20, fourth pass): every GPU test and the runtime test
# (tools/gpu-host/tests.sh), then drafter_step of the build before the pass
# (.devbin-old/tandem.xz, commit 8f63827) against this one (.devbin),
# interleaved rounds, into $OUT/session_ab.jsonl; then the one-GPU pipeline
# and its Python reference (tools/gpu-host/ratios.sh pipeline).
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
bash tools/gpu-host/tests.sh
source gpu/dev/step_ab_rounds.sh
step_ab_rounds session_ab.jsonl
# (ratios.sh's stdout also carries env.sh's lines: read its JSON lines from the file.)
if [ -n "$PIPE" ]; then
  bash tools/gpu-host/ratios.sh pipeline > /dev/null 2>&1
  python3 -c "
import json
for l in open('$OUT/ratios.jsonl'):
    if not l.startswith('{'): continue
    j = json.loads(l); print(j['case'], j.get('step_ms_median') or j.get('sample_ms_median'), j.get('data_wait_share', ''), j.get('target_ms_median', ''), j.get('drafter_ms_median', ''))"
fi
