"""An offline byte-level BPE tokenizer with a chat template, the same for every tiny model.

Trained with the `tokenizers` library over a corpus built into this module (English sentences
plus pseudo-words from a fixed syllable table, so that BPE finds enough distinct merges to fill
any vocab size). The corpus does not depend on the model seed: every tiny model of one vocab size
shares one tokenizer, so outputs of two models can be compared token by token.
"""
from __future__ import annotations

import json
import os
import random
from typing import Dict, List

SPECIAL_TOKENS = ["<|bos|>", "<|eos|>", "<|pad|>", "<|im_start|>", "<|im_end|>"]
BOS, EOS, PAD, IM_START, IM_END = SPECIAL_TOKENS

# ChatML, with the BOS token in front. `content` is used as a plain string, which is what
# sglang's OpenAI server passes for text-only messages.
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_SENTENCES = """\
The quick brown fox jumps over the lazy dog near the river bank.
A small model can still answer questions about the weather, the city and the sea.
Numbers like 12, 345 and 6789 appear in tables, prices and dates such as 2024-05-17.
She opened the window, looked at the mountains and wrote a short letter to her friend.
Engineers measure latency in milliseconds and throughput in tokens per second.
What is the capital of France? Paris is the capital of France.
List three colors: red, green and blue. Now list three animals: cat, horse and owl.
The server started, loaded the weights and printed that it was ready to serve requests.
In the morning the market opens early; farmers bring bread, cheese, apples and honey.
Please explain why the sky looks blue during the day and red at sunset.
Mixture of experts layers route every token to a few experts chosen by a small gate.
He said: "Tomorrow we will test the new build on the cluster before lunch."
Water boils at 100 degrees Celsius at sea level and freezes at 0 degrees.
Good software is tested, documented and measured before it is shipped to users.
Once upon a time a curious robot walked through the old library looking for a map.
"""

_SYLLABLES = ("ka ri to na mo le shi vu pe da zo mi ru te ga bo ni ha yu se "
              "lo fi qua wen tor sal mek dor pin gral vex thu nor bel cam").split()


def corpus(vocab_size: int) -> List[str]:
    """Deterministic training corpus (depends on the vocab size only, never on the model seed)."""
    n_pseudo_lines = max(1200, vocab_size // 2)
    rng = random.Random(20240517)
    lines = _SENTENCES.splitlines() * 8
    for _ in range(n_pseudo_lines):
        words = []
        for _ in range(rng.randint(4, 10)):
            word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
            if rng.random() < 0.15:
                word = word.capitalize()
            words.append(word)
        sep = rng.choice([". ", ", ", "; ", "! ", "? "])
        lines.append(" ".join(words) + sep + str(rng.randint(0, 99999)))
    return lines


def build_tokenizer(vocab_size: int):
    """Return a `tokenizers.Tokenizer` with exactly `vocab_size` tokens (specials at ids 0..4)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=1,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # Training is single-pass over an in-memory iterator: deterministic for a fixed corpus.
    tok.train_from_iterator(corpus(vocab_size), trainer=trainer)
    got = tok.get_vocab_size(with_added_tokens=True)
    if got != vocab_size:
        raise RuntimeError(
            f"--vocab: BPE reached {got} tokens instead of {vocab_size}; the built-in corpus is "
            f"too small for this vocab size (pass a smaller --vocab)")
    return tok


def special_ids(tok) -> Dict[str, int]:
    return {
        "bos": tok.token_to_id(BOS),
        "eos": tok.token_to_id(EOS),
        "pad": tok.token_to_id(PAD),
        "im_start": tok.token_to_id(IM_START),
        "im_end": tok.token_to_id(IM_END),
    }


def _dump(path: str, obj) -> None:
    with open(path, "w", encoding="utf-8") as f:
        json.dump(obj, f, indent=2, sort_keys=True, ensure_ascii=False)
        f.write("\n")


def save_tokenizer_files(tok, out_dir: str, max_length: int) -> Dict[str, int]:
    """Write tokenizer.json, tokenizer_config.json and special_tokens_map.json; return special ids."""
    ids = special_ids(tok)
    # tokenizers' own serialisation is deterministic (ordered maps); pretty=False keeps it compact.
    tok.save(os.path.join(out_dir, "tokenizer.json"), pretty=False)
    added = {
        str(ids[key]): {
            "content": text, "lstrip": False, "normalized": False, "rstrip": False,
            "single_word": False, "special": True,
        }
        for key, text in zip(("bos", "eos", "pad", "im_start", "im_end"), SPECIAL_TOKENS)
    }
    _dump(os.path.join(out_dir, "tokenizer_config.json"), {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS,
        "eos_token": EOS,
        "pad_token": PAD,
        "unk_token": None,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": max_length,
        "added_tokens_decoder": added,
        "additional_special_tokens": [IM_START, IM_END],
        "chat_template": CHAT_TEMPLATE,
    })
    _dump(os.path.join(out_dir, "special_tokens_map.json"), {
        "bos_token": BOS, "eos_token": EOS, "pad_token": PAD,
        "additional_special_tokens": [IM_START, IM_END],
    })
    return ids
