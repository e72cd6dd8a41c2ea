"""One LLM measured in its own process: ours (a ``.pte``), OpenVINO GenAI, or llama.cpp.

``python bench/anchor_worker.py KIND MODEL --prompt IDS --tokens N --context C``, run by
``bench/anchors.py`` with the interpreter of the environment KIND needs (ours: this
project's; GenAI and llama.cpp: the anchors' own). It imports only the library it
measures, so a contender never shares a process, or a thread pool, with another.

Every contender gets the same token ids (no tokenizer on the timed path): a warm-up
generation first (the first call at a shape pays its compilation), then prompts as
long from position 0 in one call (prefill ms: the median of three, no two with a prefix
in common, since GenAI caches prompt prefixes), the last one the prompt itself, then
``N`` greedy tokens, end-of-sequence ignored (the median ms of one token). One JSON line on stdout: ``prefill_ms``,
``decode_ms``, ``peak_mb`` (this process's peak resident memory), ``rss_mb`` (what it holds after the
last call), ``base_mb`` (what it held once its library was imported, before the model was loaded:
ExecuTorch's Python binding imports torch, which GenAI's and llama.cpp's do not), ``tokens``.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import re
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path

WARM_TOKENS = 4
PREFILLS = 3


def peak_mb(field: str = "VmHWM") -> float:
    """This process's peak resident memory in MB (``VmHWM``: from this exec on), or with ``VmRSS``
    what it holds now."""
    status = Path("/proc/self/status").read_text()
    return float(re.search(rf"{field}:\s+(\d+) kB", status).group(1)) / 1024


def ours(model: str, prompt: Sequence[int], tokens: int, context: int) -> dict:
    """A ``.pte`` from ``export-llm``, loaded from its file and run by ``Generator``, as ``generate`` runs it."""
    # As bench/__init__.py: PyTorch's idle OpenMP workers sleep (set before torch loads). Ours only:
    # llama.cpp's own OpenMP threads wait for work between its steps, and passive waiting slows them.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    from openvino_backend.llm.generate import Generator
    from openvino_backend.runtime import torch_workers_idle

    base = peak_mb("VmRSS")
    generator = Generator(Path(model))

    def run(count: int, ids: Sequence[int] = prompt) -> tuple[float, list[float], list[int]]:
        generator.position = 0  # a new prompt from position 0 in the same program
        start = time.perf_counter()
        logits = generator(ids)
        prefill = 1000 * (time.perf_counter() - start)
        times, chosen = [], []
        for _ in range(count):
            chosen.append(int(logits.argmax()))
            start = time.perf_counter()
            logits = generator(chosen[-1:])
            times.append(1000 * (time.perf_counter() - start))
        return prefill, times, chosen

    with torch_workers_idle():
        return _measured(run, prompt, tokens, base)


def genai(model: str, prompt: Sequence[int], tokens: int, context: int) -> dict:
    """OpenVINO GenAI's ``LLMPipeline`` on an ``optimum-cli export openvino`` directory, on the CPU with its
    defaults; the prompt given as token ids, greedy, end-of-sequence ignored. A token's ms is the time
    between two of the streamer's calls (GenAI calls it once per token)."""
    import openvino as ov
    import openvino_genai

    base = peak_mb("VmRSS")
    pipeline = openvino_genai.LLMPipeline(model, "CPU")

    def run(count: int, ids: Sequence[int] = prompt) -> tuple[float, list[float], list[int]]:
        inputs = openvino_genai.TokenizedInputs(ov.Tensor(_int64([list(ids)])), ov.Tensor(_int64([[1] * len(ids)])))
        config = openvino_genai.GenerationConfig()
        config.max_new_tokens = count + 1
        config.ignore_eos = True
        config.do_sample = False
        stamps: list[float] = []

        def streamer(_: object) -> openvino_genai.StreamingStatus:
            stamps.append(time.perf_counter())
            return openvino_genai.StreamingStatus.RUNNING

        result = pipeline.generate(inputs, config, streamer=streamer)
        prefill = result.perf_metrics.get_ttft().mean
        times = [1000 * (b - a) for a, b in itertools.pairwise(stamps)]
        return prefill, times, [int(t) for t in result.tokens[0][:count]]

    return _measured(run, prompt, tokens, base)


def llamacpp(model: str, prompt: Sequence[int], tokens: int, context: int, extra_buffers: bool = True) -> dict:
    """llama.cpp (``llama-cpp-python``) on the GGUF file, two threads for decode and prefill.

    Without ``extra_buffers``, as ``llama-cli --no-repack`` runs it: its weights stay in plain CPU
    buffers, not repacked for its AMX or interleaved kernels (``llama_model_params.use_extra_bufts``,
    which ``Llama`` does not take, so its default parameters are amended while it loads).
    """
    import llama_cpp
    import llama_cpp.llama as high_level
    import numpy as np

    base = peak_mb("VmRSS")
    threads = len(os.sched_getaffinity(0))
    defaults = high_level.llama_cpp.llama_model_default_params

    def amended() -> object:
        params = defaults()
        params.use_extra_bufts = extra_buffers
        return params

    high_level.llama_cpp.llama_model_default_params = amended
    try:
        llm = llama_cpp.Llama(
            model_path=model, n_ctx=context, n_threads=threads, n_threads_batch=threads, verbose=False
        )
    finally:
        high_level.llama_cpp.llama_model_default_params = defaults

    def run(count: int, ids: Sequence[int] = prompt) -> tuple[float, list[float], list[int]]:
        llm.reset()
        start = time.perf_counter()
        llm.eval(list(ids))
        prefill = 1000 * (time.perf_counter() - start)
        times, chosen = [], []
        for _ in range(count):
            last = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(llm.n_vocab(),))
            chosen.append(int(np.argmax(last)))
            start = time.perf_counter()
            llm.eval(chosen[-1:])
            times.append(1000 * (time.perf_counter() - start))
        return prefill, times, chosen

    return _measured(run, prompt, tokens, base)


def _measured(
    run: Callable[..., tuple[float, list[float], list[int]]], prompt: Sequence[int], tokens: int, base_mb: float
) -> dict:
    """Warm up, then ``PREFILLS`` prefills (the median is the answer), the last one ``prompt`` itself,
    followed by ``tokens`` greedy tokens. The others are ``prompt`` rotated: as long, no prefix in common
    with each other or with it, since GenAI's pipeline caches prompt prefixes (``enable_prefix_caching``
    is on by default on the CPU) and would otherwise time the prefill of the last tokens only."""
    run(WARM_TOKENS, _rotated(prompt, PREFILLS))
    prefills = [run(0, _rotated(prompt, k))[0] for k in range(1, PREFILLS)]
    prefill, times, chosen = run(tokens, prompt)
    return _answer(statistics.median([*prefills, prefill]), times, chosen, base_mb)


def _rotated(prompt: Sequence[int], k: int) -> list[int]:
    """``prompt`` rotated left by ``k``, or with every id shifted by ``k`` when rotating changes nothing."""
    rotated = [*prompt[k % len(prompt) :], *prompt[: k % len(prompt)]]
    return rotated if rotated[0] != prompt[0] else [t + k for t in prompt]


def _int64(rows: list[list[int]]) -> object:
    import numpy as np

    return np.array(rows, dtype=np.int64)


def _answer(prefill: float, times: list[float], chosen: list[int], base_mb: float) -> dict:
    # What it holds, then the peak: read first, the peak was once 4 kB below a later read of it.
    rss = peak_mb("VmRSS")  # after every call: what the program holds once running
    return {
        "prefill_ms": prefill,
        "decode_ms": statistics.median(times),
        "peak_mb": peak_mb(),
        "rss_mb": rss,
        "base_mb": base_mb,
        "tokens": chosen,
    }


KINDS = {"ours": ours, "genai": genai, "llamacpp": llamacpp}


def main() -> int:
    parser = argparse.ArgumentParser(prog="bench/anchor_worker.py")
    parser.add_argument("kind", choices=sorted(KINDS))
    parser.add_argument("model", help="the .pte, the optimum-cli directory or the GGUF file")
    parser.add_argument("--prompt", required=True, help="token ids, comma-separated")
    parser.add_argument("--tokens", type=int, default=64, help="greedy tokens after the prompt")
    parser.add_argument("--context", type=int, default=2048, help="llama.cpp's context")
    parser.add_argument("--no-extra-buffers", action="store_true", help="llama.cpp as `llama-cli --no-repack` runs it")
    args = parser.parse_args()
    if args.no_extra_buffers and args.kind != "llamacpp":
        parser.error("--no-extra-buffers is llama.cpp's")
    out = os.fdopen(os.dup(1), "w", buffering=1)  # the answer; what the libraries print goes to stderr
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    prompt = [int(t) for t in args.prompt.split(",")]
    try:
        options = {"extra_buffers": False} if args.no_extra_buffers else {}
        answer = KINDS[args.kind](args.model, prompt, args.tokens, args.context, **options)
    except Exception as error:  # reported as the bench's cell
        answer = {"error": f"{type(error).__name__}: {error}"}
    print(json.dumps(answer), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
