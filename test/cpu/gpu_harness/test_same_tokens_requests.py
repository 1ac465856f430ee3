"""test/gpu/test_same_tokens.py's requests fit its servers: sglang refuses a prompt whose length
plus new tokens exceeds the context length, and the tiny models have 4096 positions while the
test prefills prompts of up to 4096 tokens. Every server loads the model with more positions
(--json-model-override-args, so RoPE's cache covers them too), and every request fits."""
import json

import test_same_tokens as st
from sglang.sm120.tiny import spec


def test_every_request_fits_the_positions_the_servers_load():
    flags = st.common_flags()
    override = json.loads(flags[flags.index("--json-model-override-args") + 1])
    assert override == {"max_position_embeddings": st.POSITIONS}
    longest = max(len(p) + b["new_tokens"] for b in st.workload(vocab=4096) for p in b["prompts"])
    assert max(st.PREFILL_LENS) == 4096 and 4096 + st.PREFILL_TOKENS <= longest <= st.POSITIONS
    assert "--context-length" not in flags  # past the model's positions it would index past RoPE's cache


def test_the_tiny_models_need_it():
    assert spec.TinySpec(arch="glm4_moe").max_position < 4096 + st.PREFILL_TOKENS
