"""Every failure of every command is one line that names its cause, and a documented exit code.

Failures come from each layer a command calls: its own checks, transformers,
torch.export, ExecuTorch's runtime, OpenVINO. Some run through
``python -m openvino_backend``, where the libraries' stdout and stderr go to
the null device: a failure the command line did not explain would be silent.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from openvino_backend.tools.cli import main
from openvino_backend.tools.results import EXIT_INTERNAL, EXIT_OK, EXIT_USAGE
from tests.llm_fixtures import write_tiny_llama

transformers = pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    code = main(argv)
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("error:")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_tiny_llama(tmp_path_factory.mktemp("tiny"))  # context 64


@pytest.fixture(scope="module")
def program(tiny: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("program") / "tiny.pte"
    assert main(["export-llm", str(tiny), "-o", str(path), "--max-seq-len", "64"]) == EXIT_OK
    return path


# export-llm


def test_an_output_directory_that_does_not_exist_is_refused_before_anything_is_read(tmp_path: Path, capsys) -> None:
    missing_model = tmp_path / "no-model"  # reading it would fail too: the output is checked first
    code, _, err = _run(["export-llm", str(missing_model), "-o", str(tmp_path / "nope" / "x.pte")], capsys)
    assert code == EXIT_USAGE
    assert "the directory" in _one_error_line(err) and "does not exist" in err


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ('{"model_type": "llama", "hidden', "transformers cannot read it"),  # truncated
        ('{"hidden_size": 64}', "model_type"),
        ('{"model_type": "no-such-family"}', "no-such-family"),
    ],
    ids=["truncated", "no-model-type", "unknown-model-type"],
)
def test_configs_transformers_refuses_are_one_line(tmp_path: Path, capsys, config: str, message: str) -> None:
    (tmp_path / "config.json").write_text(config)
    code, _, err = _run(["export-llm", str(tmp_path), "-o", str(tmp_path / "x.pte")], capsys)
    assert code == EXIT_USAGE
    assert message in _one_error_line(err)
    assert not (tmp_path / "x.pte").exists()


def test_an_encoder_only_model_is_sent_to_lower_and_a_seq2seq_model_refused_by_name(tmp_path: Path, capsys) -> None:
    bert, t5 = tmp_path / "bert", tmp_path / "t5"
    transformers.BertConfig(hidden_size=64, num_hidden_layers=1, num_attention_heads=4).save_pretrained(bert)
    transformers.T5Config(d_model=64, num_layers=1, num_heads=4, d_ff=128).save_pretrained(t5)
    code, _, err = _run(["export-llm", str(bert), "-o", str(tmp_path / "b.pte")], capsys)
    assert code == EXIT_USAGE and "an encoder-only model (bert): export it with `lower`" in _one_error_line(err)
    code, _, err = _run(["export-llm", str(t5), "-o", str(tmp_path / "t.pte")], capsys)
    assert code == EXIT_USAGE and "an encoder-decoder model (t5)" in _one_error_line(err)


def test_a_decoder_torch_export_refuses_is_refused_by_family(tiny: Path, tmp_path: Path, capsys, monkeypatch) -> None:
    def refuse(*args, **kwargs):
        raise torch._dynamo.exc.Unsupported("data-dependent branching on a tensor value")

    monkeypatch.setattr(torch.export, "export", refuse)
    code, _, err = _run(["export-llm", str(tiny), "-o", str(tmp_path / "x.pte")], capsys)
    line = _one_error_line(err)
    assert code == EXIT_USAGE and "llama" in line and "torch.export cannot export it" in line
    assert "data-dependent branching" in line


# generate


@pytest.mark.slow
def test_a_truncated_program_is_one_line(program: Path, tmp_path: Path, capsys) -> None:
    data = program.read_bytes()
    for size in (10_000, len(data) - 4096):
        cut = tmp_path / f"cut-{size}.pte"
        cut.write_bytes(data[:size])
        code, out, err = _run(["generate", str(cut), "--prompt-ids", "1,2"], capsys)
        assert code == EXIT_USAGE, err
        assert str(cut) in _one_error_line(err) and not out


def test_a_program_whose_openvino_blob_is_damaged_is_one_line(program: Path, tmp_path: Path, capsys) -> None:
    data = bytearray(program.read_bytes())
    at = _blob_offset(bytes(data))
    data[at : at + 64] = b"\xff" * 64  # the compiled blob's header: OpenVINO refuses to import it
    damaged = tmp_path / "damaged.pte"
    damaged.write_bytes(bytes(data))
    code, _, err = _run(["generate", str(damaged), "--prompt-ids", "1,2"], capsys)
    assert code == EXIT_USAGE and "ExecuTorch's runtime cannot load it" in _one_error_line(err)


def _blob_offset(buffer: bytes) -> int:
    """Where the first delegate's data starts in the .pte: in a segment (ExecuTorch's layout, where the
    installed OpenVINO's import copies the blob) or inline."""
    import flatbuffers
    from executorch.exir._serialize._program import _flatbuffer_to_program, _get_extended_header
    from executorch.exir.schema import DataLocation

    from openvino_backend.program import _field, _root, _vector

    header = _get_extended_header(buffer)
    program = _flatbuffer_to_program(buffer[: header.program_size] if header and header.is_valid() else buffer)
    processed = program.execution_plan[0].delegates[0].processed
    if processed.location == DataLocation.SEGMENT:
        return header.segment_base_offset + program.segments[processed.index].offset
    inline = _vector(flatbuffers.table.Table(buffer, _root(buffer)), 3)[0]  # Program.backend_delegate_data
    return inline.Vector(_field(inline, 0))  # BackendDelegateInlineData.data


def test_prompts_are_checked_before_running(program: Path, capsys) -> None:
    code, _, err = _run(["generate", str(program), "--prompt", ""], capsys)
    assert code == EXIT_USAGE and "--prompt is empty" in _one_error_line(err)
    too_long = ",".join(["5"] * 70)
    code, out, err = _run(["generate", str(program), "--prompt-ids", too_long], capsys)
    assert code == EXIT_USAGE and "70 tokens and the program's context 64" in _one_error_line(err) and not out
    code, _, err = _run(["generate", str(program), "--prompt", "hi", "--tokenizer", str(program) + ".nope"], capsys)
    assert code == EXIT_USAGE and "no such file" in _one_error_line(err)


def test_generate_says_why_it_stopped(program: Path, capsys) -> None:
    code, _, err = _run(["generate", str(program), "--prompt-ids", "5,6,7", "--max-new-tokens", "3"], capsys)
    assert code == EXIT_OK
    assert "stopped at the requested count" in err or "stopped at an end-of-sequence token" in err
    near_end = ",".join(["5"] * 62)
    code, out, err = _run(["generate", str(program), "--prompt-ids", near_end, "--max-new-tokens", "8"], capsys)
    assert code == EXIT_OK
    assert "leaves room for 3 new tokens" in err
    assert "stopped at the end of the context" in err or "stopped at an end-of-sequence token" in err
    assert len(out.split()) <= 3


# the silent path: python -m openvino_backend, libraries' output on the null device


def _module(args: list[str], prelude: str = "") -> subprocess.CompletedProcess:
    script = textwrap.dedent(
        f"""
        import sys
        {prelude}
        from openvino_backend.__main__ import run
        sys.argv = ["openvino-backend", *{args!r}]
        sys.exit(run())
        """
    )
    return subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=600)


@pytest.mark.slow
def test_an_internal_error_is_one_line_with_the_way_to_see_more(tmp_path: Path) -> None:
    prelude = textwrap.dedent(
        """
        import openvino_backend.tools.render as render
        def broken(*args, **kwargs):
            raise TypeError("unexpected keyword 'frobnicate'")
        render.print_partitions = broken
        """
    ).replace("\n", "\n        ")
    done = _module(["lower", "copy-of-input", "-o", str(tmp_path / "x.pte")], prelude)
    assert done.returncode == EXIT_INTERNAL, done
    assert "lower failed: TypeError: unexpected keyword 'frobnicate'" in done.stderr
    assert "rerun with --debug" in done.stderr


@pytest.mark.slow
def test_a_truncated_program_is_not_silent_from_the_module(program: Path, tmp_path: Path) -> None:
    cut = tmp_path / "cut.pte"
    cut.write_bytes(program.read_bytes()[:10_000])
    done = _module(["generate", str(cut), "--prompt-ids", "1,2"])
    assert done.returncode == EXIT_USAGE
    assert done.stderr.strip().startswith("error:") and str(cut) in done.stderr


def test_lower_checks_its_output_before_lowering(tmp_path: Path, capsys) -> None:
    code, out, err = _run(["lower", "copy-of-input", "-o", str(tmp_path / "missing" / "x.pte")], capsys)
    assert code == EXIT_USAGE and "does not exist" in _one_error_line(err) and "partitions" not in out
