"""ExecuTorch's C++ LLM runner (``TextLLMRunner`` from the wheel) runs what ``export-llm`` writes,
token for token as this package's ``Generator`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import load_decoder
from openvino_backend.program import write_program
from openvino_backend.tools.cli import main
from openvino_backend.tools.results import EXIT_OK, EXIT_USAGE
from tests.llm_fixtures import write_tiny_llama

# Slow: ExecuTorch's C++ LLM runner on exported decoders.
pytestmark = pytest.mark.slow

transformers = pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")
tokenizers = pytest.importorskip("tokenizers", reason="the test's tokenizer is trained with tokenizers")

PROMPTS = ("once upon a time", "the little robot liked the sea")  # in the tokenizer's text
NEW_TOKENS = 10


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny-llama"))  # context 64


def _python_tokens(program: Path, tokenizer_path: Path, prompt: str) -> list[str]:
    from pytorch_tokenizers import get_tokenizer

    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    ids = list(get_tokenizer(str(tokenizer_path)).encode(prompt, bos=1, eos=0))
    run = Generator(program).generate(ids, NEW_TOKENS)  # a fresh load per prompt
    return [tokenizer.decode([token], skip_special_tokens=False) for token in run.tokens]


@pytest.mark.parametrize(
    ("dynamic", "weights"),
    [(True, "f32"), (False, "f32"), pytest.param(True, "int4", marks=pytest.mark.slow), (False, "int4")],
)
def test_text_llm_runner_generates_the_tokens_generator_does(
    tiny_llama: Path, tmp_path: Path, dynamic: bool, weights: str
) -> None:
    if weights != "f32":
        pytest.importorskip("nncf", reason="compressed weights run on NNCF (the quantize extra)")
    from openvino_backend.llm.runner import ExecutorchRunner

    decoder = load_decoder(tiny_llama, max_context=64)
    program = tmp_path / "tiny.pte"
    write_program(export_decoder(decoder, dynamic=dynamic, weights=weights), program)
    tokenizer = tiny_llama / "tokenizer.json"
    runner = ExecutorchRunner(program, tokenizer)
    # Two prompts on one runner, each from position 0, against a fresh program per prompt.
    for prompt in PROMPTS:
        run = runner.generate(prompt, NEW_TOKENS)
        expected = _python_tokens(program, tokenizer, prompt)
        assert expected  # NEW_TOKENS, or fewer up to an end-of-sequence token
        # Generator stops at an end-of-sequence token; the runner does not check the first token it
        # samples (the prompt's) against them, and goes on: the tokens up to that one must agree.
        got = run.pieces if len(expected) == NEW_TOKENS else run.pieces[: len(expected)]
        assert got == expected, f"{prompt!r}: runner {run.pieces} against Generator {expected}"
        assert run.prompt_tokens >= len(prompt.split())


def test_generate_runs_on_executorch_runner_from_the_command_line(tiny_llama: Path, tmp_path: Path, capsys) -> None:
    program = tmp_path / "tiny.pte"
    assert main(["export-llm", str(tiny_llama), "-o", str(program), "--max-seq-len", "64"]) == EXIT_OK
    capsys.readouterr()
    argv = ["generate", str(program), "--prompt", PROMPTS[0], "--max-new-tokens", str(NEW_TOKENS)]
    assert main(argv) == EXIT_OK
    ours = capsys.readouterr().out
    assert main([*argv, "--runner", "executorch"]) == EXIT_OK
    out, err = capsys.readouterr()
    assert out == ours and out.strip()
    assert "TextLLMRunner" in err and f"{NEW_TOKENS} new tokens" in err


# A byte-level tokenizer splits what it has not learned into bytes: the emoji into its first three
# bytes (learned from the emoji below, which share them) and its last byte alone, the CJK character
# into three single bytes. The model below says CHAIN over and over, token by token.
CHAIN = "😀 中"
CHAIN_TOKENS = ["ðŁĺ", "Ģ", "Ġ", "ä", "\u00b8", "Ń"]  # in ByteLevel's alphabet: F0 9F 98, 80, 20, E4, B8, AD
BYTE_PROMPT = "the little robot 中"  # ends with CHAIN's last token


@pytest.fixture(scope="module")
def byte_program(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A program whose greedy tokens spell CHAIN again and again, with its byte-level tokenizer."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    directory = tmp_path_factory.mktemp("byte-llama")
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=300,
        special_tokens=["<unk>", "<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token
        limit_alphabet=256,
    )
    text = "once upon a time the little robot liked the sea and read books about a boat"
    tokenizer.train_from_iterator([text] * 20 + ["😀 😁 😂 😃 😄 😅"] * 10, trainer)
    tokenizer.save(str(directory / "tokenizer.json"))
    chain = tokenizer.encode(CHAIN).ids
    assert [tokenizer.id_to_token(t) for t in chain] == CHAIN_TOKENS, "the tokenizer no longer splits CHAIN"
    assert tokenizer.encode(BYTE_PROMPT).ids[-1] == chain[-1]

    config = transformers.LlamaConfig(
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=2,
        vocab_size=tokenizer.get_vocab_size(),
        max_position_embeddings=64,
        bos_token_id=1,
        eos_token_id=2,
    )
    with torch.random.fork_rng():
        torch.manual_seed(0)
        model = transformers.LlamaForCausalLM(config)
    with torch.no_grad():
        # No layer adds to the residual stream: the last hidden state is the last token's embedding,
        # a basis vector for each CHAIN token (zero for the rest), which the head maps to the next.
        for layer in model.model.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
        model.model.embed_tokens.weight.zero_()
        model.lm_head.weight.zero_()
        for k, token in enumerate(chain):
            model.model.embed_tokens.weight[token, k] = 1.0
            model.lm_head.weight[chain[(k + 1) % len(chain)], k] = 10.0
    model.save_pretrained(directory)

    program = directory / "byte.pte"
    write_program(export_decoder(load_decoder(directory, max_context=64)), program)
    return program, directory / "tokenizer.json"


def _python_ids_and_text(program: Path, tokenizer_path: Path, prompt: str, new_tokens: int) -> tuple[list[int], str]:
    """What ``generate --runner python`` makes: ``Generator``'s tokens, decoded all at once."""
    from pytorch_tokenizers import get_tokenizer

    ids = list(get_tokenizer(str(tokenizer_path)).encode(prompt, bos=1, eos=0))
    tokens = Generator(program).generate(ids, new_tokens).tokens
    return tokens, tokenizers.Tokenizer.from_file(str(tokenizer_path)).decode(tokens, skip_special_tokens=False)


def _whole(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("new_tokens", [12, 10])  # ending after a character, and inside one
def test_text_llm_runner_assembles_characters_split_across_tokens(
    byte_program: tuple[Path, Path], new_tokens: int
) -> None:
    from openvino_backend.llm.runner import ExecutorchRunner

    program, tokenizer_path = byte_program
    tokenizer = tokenizers.Tokenizer.from_file(str(tokenizer_path))
    ids, expected = _python_ids_and_text(program, tokenizer_path, BYTE_PROMPT, new_tokens)
    assert len(ids) == new_tokens and expected.startswith("😀 中😀 ")

    run = ExecutorchRunner(program, tokenizer_path).generate(BYTE_PROMPT, new_tokens)

    assert run.text == expected
    # Tokens that are no whole UTF-8 came through (the binding's strict decoding raised on them).
    assert not all(_whole(data) for data in run.token_bytes)
    assert b"".join(run.token_bytes).decode("utf-8", errors="replace") == run.text
    assert len(run.pieces) == len(run.token_bytes) == new_tokens and "".join(run.pieces) == run.text
    # A token that is whole, with no character pending before it, is its own text.
    whole = [i for i in range(new_tokens) if _whole(run.token_bytes[i]) and _whole(b"".join(run.token_bytes[:i]))]
    assert whole  # the spaces
    for i in whole:
        assert run.pieces[i] == tokenizer.decode([ids[i]], skip_special_tokens=False)
    # strict decoding is strict again afterwards
    with pytest.raises(UnicodeDecodeError):
        b"\xf0\x9f".decode("utf-8")


def test_generate_on_executorch_runner_prints_characters_split_across_tokens(
    byte_program: tuple[Path, Path], capsys
) -> None:
    program, tokenizer_path = byte_program
    argv = ["generate", str(program), "--tokenizer", str(tokenizer_path), "--prompt", BYTE_PROMPT]
    argv += ["--max-new-tokens", "12"]
    assert main(argv) == EXIT_OK
    ours = capsys.readouterr().out
    assert main([*argv, "--runner", "executorch"]) == EXIT_OK  # was 4: UnicodeDecodeError
    out, err = capsys.readouterr()
    assert out == ours == "😀 中😀 中\n"
    assert "12 new tokens" in err


def test_strict_decoding_keeps_bytes_only_on_the_generating_thread() -> None:
    """Re-registering ``strict`` touches the whole process: only the generating thread keeps bytes,
    and the original handler is back afterwards."""
    import codecs
    import threading

    from openvino_backend.llm.runner import _token_bytes_kept

    elsewhere: list[str] = []

    def decode_elsewhere() -> None:
        try:
            b"\xe4\xb8".decode("utf-8")
        except UnicodeDecodeError as error:
            elsewhere.append(type(error).__name__)

    with _token_bytes_kept() as kept:
        assert kept
        assert b"\xe4\xb8".decode("utf-8") == "\udce4\udcb8"
        assert "\udce4\udcb8".encode("utf-8", "surrogateescape") == b"\xe4\xb8"
        with pytest.raises(UnicodeEncodeError):  # encoding stays strict
            "\udce4".encode("utf-8")
        thread = threading.Thread(target=decode_elsewhere)
        thread.start()
        thread.join()
    assert elsewhere == ["UnicodeDecodeError"]
    assert codecs.lookup_error("strict") is codecs.strict_errors
    with pytest.raises(UnicodeDecodeError):
        b"\xe4\xb8".decode("utf-8")


def test_generate_on_executorch_runner_says_to_use_python_where_bytes_cannot_be_kept(
    byte_program: tuple[Path, Path], capsys, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Python whose strict decoding skipped the codec registry: one line naming the way out, not
    an internal error."""
    import contextlib

    from openvino_backend.llm import runner

    monkeypatch.setattr(runner, "_token_bytes_kept", lambda: contextlib.nullcontext(False))
    program, tokenizer_path = byte_program
    argv = ["generate", str(program), "--tokenizer", str(tokenizer_path), "--prompt", BYTE_PROMPT, "--runner"]
    assert main([*argv, "executorch"]) == EXIT_USAGE
    err = capsys.readouterr().err
    assert "part of a UTF-8 character" in err and err.rstrip().endswith("use --runner python")
