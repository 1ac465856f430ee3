#!/usr/bin/env bash
# glm_moe_dsa NVFP4 under the launch line with decode graphs up to bs 64, traps logging: one
# greedy batch of 64, then the trap log (full stacks) is kept.
python3 -m sglang.sm120.tiny --arch glm_moe_dsa --quant nvfp4 --out /tmp/tiny/glm_moe_dsa-nvfp4 >/dev/null 2>&1 || true
rm -f /tmp/res/dsa-traps.jsonl
SGLANG_DSA_PREFILL_DENSE_ATTN_KV_LEN_THRESHOLD=0 SGLANG_SM120_TRAPS=log SGLANG_SM120_TRAP_LOG=/tmp/res/dsa-traps.jsonl \
setsid python3 -m sglang.launch_server --model-path /tmp/tiny/glm_moe_dsa-nvfp4 --port 31555 --skip-tokenizer-init \
  --enable-piecewise-cuda-graph --piecewise-cuda-graph-compiler eager --quantization modelopt_fp4 --trust-remote-code \
  --mem-fraction-static 0.7 --max-running-requests 1024 --cuda-graph-max-bs 64 \
  --attention-backend dsa --dsa-prefill-backend flashmla_sparse --dsa-decode-backend flashmla_sparse \
  --kv-cache-dtype bfloat16 --page-size 64 > /tmp/res/dsa-traps-server.log 2>&1 &
pid=$!
for i in $(seq 1 120); do curl -sf localhost:31555/health >/dev/null && break; sleep 3; done
python3 - <<'PY'
import json, urllib.request, concurrent.futures as cf
def post(ids):
    req = urllib.request.Request("http://127.0.0.1:31555/generate", json.dumps({"input_ids": ids,
          "sampling_params": {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}}).encode(),
          {"Content-Type": "application/json"})
    return json.loads(urllib.request.urlopen(req, timeout=300).read())
prompts = [[3 + (i * 7 + j * 13) % 1000 for j in range(16 + i % 48)] for i in range(64)]
with cf.ThreadPoolExecutor(64) as p:
    outs = list(p.map(post, prompts))
print("answered", sum(len(o["output_ids"]) == 8 for o in outs))
PY
kill -INT -- -$pid 2>/dev/null; sleep 10; kill -9 -- -$pid 2>/dev/null
python3 -c "
import json
hits=[json.loads(l) for l in open('/tmp/res/dsa-traps.jsonl')] if __import__('os').path.exists('/tmp/res/dsa-traps.jsonl') else []
print('trap hits', len(hits))
"
