"""Tiny tokenizers and models built in the tests themselves (no downloads). A module with a unique
name, so test files in any folder can import it (several folders have their own conftest.py)."""

from __future__ import annotations

CHATML = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
CORPUS = [
    "add the piano bar to my Cindy Wilson playlist",
    "book a table for two in Paris tonight",
    "what is the weather in Rome tomorrow",
    '{"intent": "PlayMusic", "slots": {"artist": "Abba"}}',
    "rate this book five out of six",
    "hello world",
    "a b c",
    "x y z",
    "Reply with JSON only.",
]


def make_tokenizer(chat_template: str | None = CHATML, vocab_size: int = 300):
    """A byte-level BPE tokenizer trained on a tiny corpus; eos == pad == <|im_end|> (like SmolLM2)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 20, trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = chat_template
    return fast


def make_llama(
    vocab_size: int,
    seed: int = 0,
    *,
    hidden: int = 32,
    intermediate: int = 64,
    layers: int = 2,
    heads: int = 4,
    kv_heads: int = 2,
    max_positions: int = 256,
    **kw,
):
    """A random LlamaForCausalLM (fp32, SDPA), default hidden 32, MLP 64, 2 layers, 4 heads, 2 KV heads."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=intermediate,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=max_positions,
        eos_token_id=2,
        pad_token_id=2,
        bos_token_id=1,
        **kw,
    )
    return LlamaForCausalLM(cfg)
