"""Decode time of a ``.pte`` fed one token per call, with nothing of this package loaded (the
process measuring ExecuTorch's own OpenVINO backend must not define a second ``OpenvinoBackend``)."""

from __future__ import annotations

import statistics
import time
from collections.abc import Sequence

import torch
from executorch.runtime import Runtime

STEPS = 32


def token_per_call_ms(buffer: bytes, prompt: Sequence[int], steps: int = STEPS) -> float:
    """Median ms of one decode call of a program taking ``(tokens [1, 1], start [1])``, after the
    prompt fed a token per call, each next token the argmax of the last logits."""
    program = Runtime.get().load_program(buffer)  # held while its method runs
    method = program.load_method("forward")
    logits = None
    for position, token in enumerate(prompt):
        logits = method.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
    position = len(prompt)
    times = []
    for _ in range(steps):
        token = torch.tensor([[int(logits.reshape(-1, logits.shape[-1])[-1].argmax())]])
        start = time.perf_counter()
        logits = method.execute([token, torch.tensor([position])])[0]
        times.append(1000 * (time.perf_counter() - start))
        position += 1
    return statistics.median(times)
