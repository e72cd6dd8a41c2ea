"""``bench --llm --anchors --prompt-tokens N`` times decode after a prompt of N tokens: one that, with the
tokens generated after it, would not fit the programs' context is refused before anything is exported."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from bench.anchors import CONTEXT, TOKENS, check_prompt_tokens

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
