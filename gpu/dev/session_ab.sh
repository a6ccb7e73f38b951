# On the GPU host (issue 20, fourth pass): every GPU test and the runtime test
# (tools/gpu-host/tests.sh), then drafter_step of the build before the pass
# (.devbin-old/tandem.xz, commit 8f63827) against this one (.devbin),
# interleaved rounds, into $OUT/session_ab.jsonl; then the one-GPU pipeline
# and its Python reference (tools/gpu-host/ratios.sh pipeline).
source tools/gpu-host/env.sh > /dev/null
OUT=${OUT:-/tmp}
bash tools/gpu-host/tests.sh
mkdir -p /tmp/old && xz -dc .devbin-old/tandem.xz > /tmp/old/tandem && chmod +x /tmp/old/tandem
for r in ${ROUNDS:-1 2}; do
  for v in old new; do
    bin=build/bin/tandem; [ $v = old ] && bin=/tmp/old/tandem
    timeout 100 $bin bench drafter_step --size 8b --warmup 2 --iters 8 2>>$OUT/ab.err \
      | sed "s/^{/{\"build\": \"$v\", \"round\": $r, /" | tee -a $OUT/session_ab.jsonl | python3 -c "
import json,sys
for l in sys.stdin:
    j = json.loads(l); k = j.get('kernel_ms') or {}
    print(j['build'], j['round'], j.get('mode'), round(j['median_ms'], 2), round(j['mfu'], 4), round(j['peak_mem_gib'], 2),
          {c: round(v['ms'], 2) for c, v in k.items() if isinstance(v, dict) and v['ms'] > 0.1})"
  done
done
# (ratios.sh's stdout also carries env.sh's lines: read its JSON lines from the file.)
if [ -n "$PIPE" ]; then
  bash tools/gpu-host/ratios.sh pipeline > /dev/null 2>&1
  python3 -c "
import json
for l in open('$OUT/ratios.jsonl'):
    if not l.startswith('{'): continue
    j = json.loads(l); print(j['case'], j.get('step_ms_median') or j.get('sample_ms_median'), j.get('data_wait_share', ''), j.get('target_ms_median', ''), j.get('drafter_ms_median', ''))"
fi
