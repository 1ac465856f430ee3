"""test/gpu/test_same_tokens.py's requests fit its servers: sglang refuses a prompt whose length
plus new tokens exceeds the context length (the tiny models have 4096 positions and the test
prefills up to 4096 tokens), so every server runs at the test's longer context, with upstream's
override variable set, and every request of the workload fits it."""
import test_same_tokens as st


def _flag(flags, name):
    return flags[flags.index(name) + 1]


def test_every_request_fits_the_servers_context_length():
    assert int(_flag(st.common_flags(), "--context-length")) == st.CONTEXT_LENGTH
    longest = max(len(p) + b["new_tokens"] for b in st.workload(vocab=4096) for p in b["prompts"])
    assert max(st.PREFILL_LENS) == 4096 and 4096 + st.PREFILL_TOKENS <= longest <= st.CONTEXT_LENGTH


def test_every_server_may_run_past_the_models_positions():
    for model in st.MODELS + ["glm_moe_dsa-nvfp4"]:
        _, env = st.model_flags_env(model)
        assert env["SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN"] == "1", model
