"""Decode time of a ``.pte``, with nothing of this package loaded (the process measuring ExecuTorch's
own OpenVINO backend must not define a second ``OpenvinoBackend``); as a command, one ``.pte`` file
measured in a fresh process, its peak memory with it."""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as bench/__init__.py: PyTorch's idle workers sleep

import torch
from executorch.runtime import Runtime

from bench import answer_stream

STEPS = 32


def peak_mb() -> float:
    """This process's peak resident memory in MB: ``VmHWM``, which starts afresh at exec (``getrusage``'s
    ``ru_maxrss`` would carry the parent's peak over from the fork)."""
    status = Path("/proc/self/status").read_text()
    return float(re.search(r"VmHWM:\s+(\d+) kB", status).group(1)) / 1024


def token_per_call_ms(buffer: bytes, prompt: Sequence[int], steps: int = STEPS) -> float:
    """Median ms of one decode call of a program taking ``(tokens [1, 1], start [1])``, after the
    prompt fed a token per call, each next token the argmax of the last logits."""
    program = Runtime.get().load_program(buffer)  # held while its method runs
    method = program.load_method("forward")
    logits, _ = prefill(method, prompt, one_call=False)
    return decode_ms(method, logits, len(prompt), steps)


def measure_file(path: str, prompt: Sequence[int], one_call_prefill: bool, steps: int = STEPS) -> dict[str, float]:
    """Prefill and decode a ``.pte`` read from ``path``: prefill ms (the prompt in one call, or a
    token per call; the second prefill, over the first), median decode ms, and the peak resident
    memory of this process in MB."""
    program = Runtime.get().load_program(Path(path))  # from its file, as deployments; held while it runs
    method = program.load_method("forward")
    prefill(method, prompt, one_call_prefill)  # the first call at a shape pays OpenVINO's set-up
    logits, prefill_ms = prefill(method, prompt, one_call_prefill)
    decode = decode_ms(method, logits, len(prompt), steps)
    return {"prefill_ms": prefill_ms, "decode_ms": decode, "peak_mb": peak_mb()}


def prefill(method: object, prompt: Sequence[int], one_call: bool) -> tuple[torch.Tensor, float]:
    """The last logits after ``prompt`` from position 0 (in one call, or a token per call), and ms."""
    start = time.perf_counter()
    if one_call:
        logits = method.execute([torch.tensor([list(prompt)]), torch.tensor([0])])[0]
    else:
        for position, token in enumerate(prompt):
            logits = method.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
    return logits, 1000 * (time.perf_counter() - start)


def decode_ms(method: object, logits: torch.Tensor, position: int, steps: int) -> float:
    """Median ms of ``steps`` one-token calls from ``position``, each token the last logits' argmax."""
    times = []
    for _ in range(steps):
        token = torch.tensor([[int(logits.reshape(-1, logits.shape[-1])[-1].argmax())]])
        start = time.perf_counter()
        logits = method.execute([token, torch.tensor([position])])[0]
        times.append(1000 * (time.perf_counter() - start))
        position += 1
    return statistics.median(times)


def main() -> int:
    """``python -m bench.decode FILE.pte --prompt IDS [--one-call-prefill]``: one JSON line."""
    parser = argparse.ArgumentParser(prog="python -m bench.decode")
    parser.add_argument("pte")
    parser.add_argument("--prompt", required=True, help="token ids, comma-separated")
    parser.add_argument("--one-call-prefill", action="store_true", help="the program takes a prompt of any length")
    args = parser.parse_args()
    out = answer_stream()
    prompt = [int(t) for t in args.prompt.split(",")]
    try:
        print(json.dumps(measure_file(args.pte, prompt, args.one_call_prefill)), file=out)
    except Exception as error:  # reported as the bench's cell
        print(json.dumps({"error": f"{type(error).__name__}: {error}"}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
