"""ExecuTorch's C++ LLM runner (``TextLLMRunner`` from the wheel) runs what ``export-llm`` writes,
token for token as this package's ``Generator`` does."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.tiny_llm import write_tiny_llama
from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import load_decoder
from openvino_backend.program import write_program
from openvino_backend.tools.cli import main
from openvino_backend.tools.results import EXIT_OK

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
