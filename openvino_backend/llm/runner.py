"""ExecuTorch's own C++ LLM runner (``TextLLMRunner``, the code its apps embed) on an exported program.

The runner loads the ``.pte`` from its path and finds OpenVINO's C library by
``OPENVINO_LIB_PATH`` (its ``dlopen("libopenvino_c.so")`` finds nothing in a
pip install otherwise); ``openvino_c_library_path`` gives the installed one.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from openvino_backend.blob_import import openvino_c_library_path
from openvino_backend.program import check_program_file

LIBRARY_VARIABLE = "OPENVINO_LIB_PATH"


def point_runtime_at_openvino() -> None:
    """Set ``OPENVINO_LIB_PATH`` to the installed OpenVINO unless the user set it."""
    if not os.environ.get(LIBRARY_VARIABLE) and (path := openvino_c_library_path()) is not None:
        os.environ[LIBRARY_VARIABLE] = path


@dataclass
class RunnerGeneration:
    """What one ``TextLLMRunner.generate`` produced: the text of each new token, and its timing."""

    pieces: list[str] = field(default_factory=list)
    prompt_tokens: int = 0
    prefill_ms: float = 0.0
    ms_per_token: float = 0.0

    @property
    def text(self) -> str:
        return "".join(self.pieces)


class ExecutorchRunner:
    """``TextLLMRunner`` over a program written by ``export-llm`` and its tokenizer."""

    def __init__(self, program: Path, tokenizer: Path) -> None:
        check_program_file(Path(program))
        point_runtime_at_openvino()
        from executorch.extension.llm.runner import TextLLMRunner

        self._runner = TextLLMRunner(str(program), str(tokenizer))

    def generate(self, prompt: str, max_new_tokens: int, *, bos: int = 1) -> RunnerGeneration:
        """Greedy generation from position 0 (the runner's cache is reset first)."""
        from executorch.extension.llm.runner import GenerationConfig

        run = RunnerGeneration()
        stats = []
        config = GenerationConfig(echo=False, max_new_tokens=max_new_tokens, temperature=0.0, num_bos=bos)
        self._runner.reset()
        self._runner.generate(prompt, config, token_callback=run.pieces.append, stats_callback=stats.append)
        if stats:
            s = stats[-1]
            run.prompt_tokens = s.num_prompt_tokens
            run.prefill_ms = float(s.prompt_eval_end_ms - s.inference_start_ms)
            if s.num_generated_tokens > 1:
                run.ms_per_token = (s.inference_end_ms - s.first_token_ms) / (s.num_generated_tokens - 1)
        return run
