"""``bench --llm --anchors`` measures our programs through ``bench/anchor_worker.py``: it must run them
from their files as ``generate`` does, and a second prompt from position 0 in the same program must
give the tokens a fresh program gives, or the bench would time a computation that is not ours."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import load_decoder

# Slow: a decoder exported and timed in a worker process.
pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
# Under .ci/avx2 the worker runs under the same emulator: user-mode QEMU does not follow exec, and a blob
# compiled for the emulated CPU does not import on the host's.
EMULATOR = shlex.split(os.environ.get("AVX2_EMULATOR", ""))
TINY_LLAMA = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "vocab_size": 256}


def test_the_worker_times_what_a_fresh_program_computes(tmp_path: Path) -> None:
    params = tmp_path / "params.json"
    params.write_text(json.dumps(TINY_LLAMA))
    program = tmp_path / "tiny.pte"
    program.write_bytes(export_decoder(load_decoder(params, max_context=64)).buffer)
    prompt = torch.randint(0, TINY_LLAMA["vocab_size"], (9,), generator=torch.Generator().manual_seed(1)).tolist()
    tokens = 12

    command = [*EMULATOR, sys.executable, str(ROOT / "bench" / "anchor_worker.py"), "ours", str(program)]
    command += ["--prompt", ",".join(map(str, prompt)), "--tokens", str(tokens)]
    done = subprocess.run(command, capture_output=True, text=True, timeout=3000 if EMULATOR else 600, cwd=ROOT)
    assert done.returncode == 0, done.stderr[-2000:]
    answer = json.loads(done.stdout.strip().splitlines()[-1])
    assert "error" not in answer, answer

    # The worker prefilled and decoded once to warm up, then again from position 0: its tokens are
    # the second run's. A fresh program, the prompt once, greedy, end-of-sequence ignored:
    fresh = Generator(program)
    logits, want = fresh(prompt), []
    for _ in range(tokens):
        want.append(int(logits.argmax()))
        logits = fresh(want[-1:])
    assert answer["tokens"] == want
    assert answer["prefill_ms"] > 0 and answer["decode_ms"] > 0 and answer["peak_mb"] >= answer["rss_mb"] > 0
    assert answer["rss_mb"] > answer["base_mb"] > 0  # the model holds memory beyond the imported library
