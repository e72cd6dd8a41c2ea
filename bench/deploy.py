"""Programs as deployments run them (``python -m bench --deploy``).

* long run: an exported decoder loaded from its file (memory-mapped) and the
  same program loaded from bytes, 1,000 decode calls across several prompts,
  each prompt from position 0 (what resets the cache): the logits of every
  call compared exactly, and the resident memory after the first prompt and
  at the end;
* ExecuTorch's C++ ``TextLLMRunner`` (what its apps embed) against this
  package's ``Generator`` on the same program: decode and prefill ms, and
  whether the tokens agree.
"""

from __future__ import annotations

import re
import statistics
import tempfile
import time
from pathlib import Path

import torch
from executorch.runtime import Runtime

from bench.tiny_llm import TEXT, write_tiny_llama
from openvino_backend.llm.export import export_decoder
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import load_decoder
from openvino_backend.program import write_program

CALLS = 1000
PROMPTS = 10
SIZE = {"hidden": 256, "layers": 4, "heads": 8, "kv_heads": 2, "context": 256}
LONG_RUN_HEADERS = ("weights", "calls", "prompts", "logits equal (file / bytes)", "RSS after prompt 1 MB", "RSS end MB")
RUNNER_HEADERS = (
    "weights",
    "Generator decode ms",
    "TextLLMRunner decode ms",
    "runner / Generator",
    "Generator prefill ms",
    "TextLLMRunner prefill ms",
    "same tokens",
)


def rss_mb() -> float:
    return float(re.search(r"VmRSS:\s+(\d+) kB", Path("/proc/self/status").read_text()).group(1)) / 1024


def _long_run(path: Path, prompt_ids: list[list[int]]) -> tuple[bool, float, float]:
    """Every call's logits equal between the file- and the bytes-loaded program; RSS after the
    first prompt and at the end."""
    runtime = Runtime.get()
    from_file, from_bytes = runtime.load_program(path), runtime.load_program(path.read_bytes())  # held
    methods = [from_file.load_method("forward"), from_bytes.load_method("forward")]
    steps = CALLS // len(prompt_ids) - 1
    equal, after_first = True, 0.0
    for number, prompt in enumerate(prompt_ids):
        logits = [m.execute([torch.tensor([prompt]), torch.tensor([0])])[0] for m in methods]  # from 0: reset
        position = len(prompt)
        for _ in range(steps):
            equal &= torch.equal(logits[0], logits[1])
            token = torch.tensor([[int(logits[0].reshape(-1, logits[0].shape[-1])[-1].argmax())]])
            logits = [m.execute([token, torch.tensor([position])])[0] for m in methods]
            position += 1
        equal &= torch.equal(logits[0], logits[1])
        if number == 0:
            after_first = rss_mb()
    return equal, after_first, rss_mb()


def _generator_ms(path: Path, ids: list[int], new_tokens: int) -> tuple[float, float, list[int]]:
    generator = Generator(path)
    generator(ids)  # the first call at a shape pays OpenVINO's set-up
    generator.position = 0
    start = time.perf_counter()
    run = generator.generate(ids, new_tokens)
    total = 1000 * (time.perf_counter() - start)
    return statistics.mean(run.decode_ms), total - sum(run.decode_ms), run.tokens


def bench_deploy() -> tuple[list[list[object]], list[list[object]]]:
    from pytorch_tokenizers import get_tokenizer

    from openvino_backend.llm.runner import ExecutorchRunner

    long_rows, runner_rows = [], []
    with tempfile.TemporaryDirectory() as tmp:
        directory = write_tiny_llama(Path(tmp) / "model", **SIZE)
        tokenizer_path = directory / "tokenizer.json"
        tokenizer = get_tokenizer(str(tokenizer_path))
        words = TEXT.split()
        prompts = [" ".join(words[i % len(words) :] + words[: i % len(words)])[:60] for i in range(PROMPTS)]
        prompt_ids = [list(tokenizer.encode(p, bos=1, eos=0)) for p in prompts]
        for weights in ("f32", "int4"):
            decoder = load_decoder(directory, max_context=SIZE["context"])
            path = Path(tmp) / f"{weights}.pte"
            write_program(export_decoder(decoder, weights=weights), path)
            equal, first, end = _long_run(path, prompt_ids)
            long_rows.append([weights, CALLS, PROMPTS, "yes" if equal else "NO", f"{first:.0f}", f"{end:.0f}"])
            new_tokens = SIZE["context"] // 2
            ours_decode, ours_prefill, ours_tokens = _generator_ms(path, prompt_ids[0], new_tokens)
            runner = ExecutorchRunner(path, tokenizer_path)
            runner.generate(prompts[0], new_tokens)  # warm, as Generator is
            run = runner.generate(prompts[0], new_tokens)
            pieces = [tokenizer.decode([t]) for t in ours_tokens]
            runner_rows.append(
                [
                    weights,
                    f"{ours_decode:.2f}",
                    f"{run.ms_per_token:.2f}",
                    f"{run.ms_per_token / ours_decode:.2f}",
                    f"{ours_prefill:.1f}",
                    f"{run.prefill_ms:.0f}",
                    "yes" if run.text == "".join(pieces) else "NO",
                ]
            )
    return long_rows, runner_rows
