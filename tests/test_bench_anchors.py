"""``bench --llm --anchors --prompt-tokens N`` times decode after a prompt of N tokens: one that, with the
tokens generated after it, would not fit the programs' context is refused before anything is exported.
llama.cpp, when its build for this CPU crashes, is measured as ``llama-cli --no-repack`` runs it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import bench.anchors
from bench.anchors import CONTEXT, NO_EXTRA_BUFFERS, TOKENS, check_prompt_tokens, measure_llamacpp

# Slow: exports and worker processes of the anchors bench.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


def test_a_prompt_fits_the_context_with_the_tokens_after_it() -> None:
    check_prompt_tokens(1)
    check_prompt_tokens(CONTEXT - TOKENS - 1)
    for count in (0, CONTEXT - TOKENS):
        with pytest.raises(ValueError, match=f"prompt of {count} tokens"):
            check_prompt_tokens(count)


def test_the_command_line_refuses_a_prompt_past_the_context() -> None:
    command = [sys.executable, "-m", "bench", "--llm", "--anchors", "--prompt-tokens", str(CONTEXT)]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2
    assert f"--prompt-tokens: prompt of {CONTEXT} tokens" in done.stderr


def test_llama_cpp_that_crashes_is_measured_without_its_extra_buffers(monkeypatch: pytest.MonkeyPatch) -> None:
    calls = []
    answers = iter(
        [
            {"error": "killed by signal 11: []", "exit": -11},  # SIGSEGV, as measure() reports it
            {"decode_ms": 9.0},
            {"decode_ms": 8.0},
        ]
    )

    def measure(kind: str, model: Path, prompt: list[int], options: tuple[str, ...] = ()) -> dict:
        calls.append((kind, options))
        return next(answers)

    monkeypatch.setattr(bench.anchors, "measure", measure)
    options: list[str] = []
    assert measure_llamacpp(Path("m.gguf"), [1], options) == {"decode_ms": 9.0}
    assert calls == [("llamacpp", ()), ("llamacpp", (NO_EXTRA_BUFFERS,))]
    assert measure_llamacpp(Path("m.gguf"), [1], options) == {"decode_ms": 8.0}  # remembered: one call
    assert calls[2:] == [("llamacpp", (NO_EXTRA_BUFFERS,))]


def test_llama_cpp_that_fails_without_crashing_is_reported_as_it_failed(monkeypatch: pytest.MonkeyPatch) -> None:
    failed = {"error": "exit 1: ['FileNotFoundError']", "exit": 1}
    monkeypatch.setattr(bench.anchors, "measure", lambda *args, **kwargs: failed)
    options: list[str] = []
    assert measure_llamacpp(Path("m.gguf"), [1], options) is failed
    assert options == []


def test_the_worker_takes_no_extra_buffers_for_llama_cpp_alone() -> None:
    command = [sys.executable, "bench/anchor_worker.py", "ours", "x.pte", "--prompt", "1", NO_EXTRA_BUFFERS]
    done = subprocess.run(command, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert done.returncode == 2
    assert "--no-extra-buffers is llama.cpp's" in done.stderr


def test_our_program_is_exported_by_the_command_in_a_process_of_its_own(tmp_path: Path) -> None:
    """The bench exports with ``export-llm`` in a fresh process: what fails is reported with the
    command's own message, and leaves no program behind for the next run to take as done."""
    checkpoint = tmp_path / "not-a-model"
    checkpoint.mkdir()
    with pytest.raises(RuntimeError, match=r"export-llm failed \(exit 3\): .*not-a-model: expected a params.json"):
        bench.anchors.our_program(checkpoint, "int4")
    assert not list((tmp_path / "anchors").glob("*.pte"))


def test_our_int8_program_takes_genais_weight_scheme(tmp_path: Path, monkeypatch) -> None:
    """GenAI's int8 anchor is optimum-cli's ``--sym``: ours is exported symmetric too, under a name of its
    own (an asymmetric program left by an earlier run is not taken for it)."""
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(bench.anchors.subprocess, "run", run)
    checkpoint = tmp_path / "model"
    (tmp_path / "anchors").mkdir()
    (tmp_path / "anchors" / "model-ours-int8.pte").write_bytes(b"asymmetric")
    path = bench.anchors.our_program(checkpoint, "int8")
    assert path.name == "model-ours-int8-sym.pte" and commands, (path, commands)
    assert commands[0][commands[0].index("--weights") :][:3] == ["--weights", "int8", "--sym"], commands[0]
    bench.anchors.our_program(checkpoint, "int4")
    assert "--sym" not in commands[1], commands[1]
