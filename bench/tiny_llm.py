"""A small Hugging Face Llama directory with a tokenizer ExecuTorch's C++ runner reads: random
weights, and a byte-level BPE whose every token is ASCII (each token's text stands on its own, as
``TextLLMRunner`` hands it to its callback)."""

from __future__ import annotations

from pathlib import Path

TEXT = "once upon a time the little robot liked the sea and read books about a boat"


def write_tokenizer(directory: Path, *, vocab_size: int | None = None) -> int:
    """``directory/tokenizer.json``, trained on ``TEXT``; padded with added ASCII tokens up to
    ``vocab_size`` if given (every id a model of that vocabulary emits then has a text). Its size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c.isascii() and c.isprintable()] + ["Ġ"]
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet, limit_alphabet=len(alphabet)
    )
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    if vocab_size is not None and vocab_size > tokenizer.get_vocab_size():
        tokenizer.add_tokens([f"<t{i}>" for i in range(tokenizer.get_vocab_size(), vocab_size)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    return tokenizer.get_vocab_size()


def write_tiny_llama(
    directory: Path, *, hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, context: int = 64
) -> Path:
    import transformers

    vocab_size = write_tokenizer(directory)
    transformers.LlamaConfig(
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        vocab_size=vocab_size,
        max_position_embeddings=context,
        bos_token_id=1,
        eos_token_id=2,
    ).save_pretrained(directory)
    return directory
