"""Generate text from a ``.pte`` exported by ``export.py``, with ExecuTorch's runtime.

The prompt is prefilled in one call when the program takes prompts of any
length (``enable_dynamic_shape``), otherwise a token per call; then one call
per new token. Greedy decoding: the same tokens on every run.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from openvino_backend.runtime import torch_workers_idle
from openvino_backend.tools.verify import LoadedMethod


@dataclass
class Generation:
    """The tokens a run produced and how long it took."""

    prompt: list[int]
    tokens: list[int] = field(default_factory=list)
    prefill_ms: float = 0.0
    decode_ms: list[float] = field(default_factory=list)
    # Why generation ended: "the requested count", "an end-of-sequence token", "the end of the context".
    stopped: str = "the requested count"

    @property
    def ms_per_token(self) -> float:
        ordered = sorted(self.decode_ms)
        return ordered[len(ordered) // 2] if ordered else 0.0


class Generator:
    """One loaded program (its KV cache lives as long as this object): prefill, then decode."""

    def __init__(self, program: bytes | Path) -> None:
        self.method = LoadedMethod(program)
        self.max_context = int(self.method.constant("get_max_seq_len") or 0)
        self.dynamic = bool(self.method.constant("enable_dynamic_shape"))
        self.vocab_size = int(self.method.constant("get_vocab_size") or 0)
        eos = self.method.constant("get_eos_ids")
        self.eos_ids = {int(e) for e in (eos if isinstance(eos, list) else [eos] if eos is not None else [])}
        self.position = 0

    def __call__(self, tokens: Sequence[int]) -> torch.Tensor:
        """Logits after ``tokens``, appended at the current position."""
        if self.max_context and self.position + len(tokens) > self.max_context:
            raise ValueError(f"{self.position + len(tokens)} tokens exceed the program's context of {self.max_context}")
        if self.dynamic:
            logits = self._call(tokens)
        else:
            for token in tokens:
                logits = self._call([token])
        return logits

    def _call(self, tokens: Sequence[int]) -> torch.Tensor:
        ids = torch.tensor([list(tokens)], dtype=torch.long)
        logits = self.method([ids, torch.tensor([self.position], dtype=torch.long)])[0]
        self.position += len(tokens)
        return logits.reshape(-1, logits.shape[-1])[-1]

    def generate(
        self, prompt: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None = None
    ) -> Generation:
        if not prompt:
            raise ValueError("the prompt is empty: give at least one token")
        with torch_workers_idle():  # the argmax between calls too: no PyTorch worker spins beside OpenVINO
            return self._generate(prompt, max_new_tokens, on_token)

    def _generate(
        self, prompt: Sequence[int], max_new_tokens: int, on_token: Callable[[int], None] | None
    ) -> Generation:
        run = Generation(list(prompt))
        start = time.perf_counter()
        logits = self(prompt)
        run.prefill_ms = 1000 * (time.perf_counter() - start)
        for _ in range(max_new_tokens):
            token = int(logits.argmax())
            run.tokens.append(token)
            if on_token is not None:
                on_token(token)
            if token in self.eos_ids:
                run.stopped = "an end-of-sequence token"
                break
            if self.max_context and self.position >= self.max_context:
                run.stopped = "the end of the context" if len(run.tokens) < max_new_tokens else run.stopped
                break
            start = time.perf_counter()
            logits = self([token])
            run.decode_ms.append(1000 * (time.perf_counter() - start))
        return run
