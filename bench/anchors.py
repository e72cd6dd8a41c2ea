"""``python -m bench --llm --anchors [--working-size] [--prompt-tokens N]``: ours against what an OpenVINO
user and a llama.cpp user run, on the same checkpoint (docs/llm.md).

* OpenVINO GenAI's ``LLMPipeline`` (the OpenVINO release ours runs on) on what ``optimum-cli export
  openvino --task text-generation-with-past`` writes, weights as ``OPTIMUM_WEIGHTS``;
* llama.cpp (``llama-cpp-python``) on the GGUF file the checkpoint comes from (Q4_1); where its build
  for this CPU crashes, as ``llama-cli --no-repack`` runs it (``measure_llamacpp``).

They live in an environment of their own under ``~/.cache/openvino_backend/anchors``
(``ANCHOR_PACKAGES``), never in the package's dependencies. Ours: SmolLM2-135M-Instruct
(``bench/real_checkpoint.py``) exported by ``export-llm`` at ``CONTEXT``, f32, int8 ``--sym`` (GenAI's
scheme) and int4; with ``--working-size`` also a Llama of dim 2048, 16 layers (``WORKING``), against
GenAI. Each contender runs in a fresh process per round (``bench/anchor_worker.py``), rounds
interleaved; ratios are the median of the per-round ratios.
"""

from __future__ import annotations

import itertools
import json
import logging
import subprocess
import sys
import venv
from pathlib import Path

from bench.harness import child_env, median, run_child, table
from bench.real_checkpoint import CACHE as SMOLLM2
from bench.real_checkpoint import checkpoint_directory, gguf_file
from openvino_backend.runtime import openvino_version

logger = logging.getLogger(__name__)

ROOT = SMOLLM2.parent
# The anchors run on the OpenVINO ours runs on (each line with the NNCF made for it).
OPENVINO = openvino_version()
ENVIRONMENT = ROOT / "anchors" / f"env-{OPENVINO}"
WORKER = Path(__file__).with_name("anchor_worker.py")
# optimum-intel goes in on its own, without its dependencies: it requires torchvision, which no release
# built for torch 2.13 satisfies here, and which its export of a decoder never imports.
ANCHOR_PACKAGES = (
    "torch==2.13.0",
    f"openvino=={OPENVINO}",
    f"openvino-tokenizers=={OPENVINO}.*",
    f"openvino-genai=={OPENVINO}.*",
    "transformers>=4.51,<5.6",
    "optimum~=2.3.0",
    "nncf>=3.1,<3.3" if OPENVINO.startswith("2025.") else "nncf>=3.3",
    "requests>=2.33,<3",
    "setuptools",
    "llama-cpp-python==0.3.36",
)
NO_DEPS = ("optimum-intel==2.2.0",)
NO_EXTRA_BUFFERS = "--no-extra-buffers"
WEIGHTS = ("f32", "int8", "int4")
OPTIMUM_WEIGHTS = {
    "f32": ["--weight-format", "fp32"],
    "int8": ["--weight-format", "int8", "--sym"],
    "int4": ["--weight-format", "int4", "--sym", "--group-size", "128", "--ratio", "1.0"],
}
# Ours with GenAI's weight scheme: its int8 is --sym, so ours is too (export-llm's int4 always is).
OURS_WEIGHTS = {"f32": [], "int8": ["--sym"], "int4": []}
CONTEXT = 2048
PROMPT_TOKENS = 56
TOKENS = 64
ROUNDS = 5
WORKING = {
    "hidden_size": 2048,
    "num_hidden_layers": 16,
    "num_attention_heads": 32,
    "num_key_value_heads": 8,
    "intermediate_size": 8192,
    "vocab_size": 32000,
    "max_position_embeddings": CONTEXT,
}
TEXT = (
    "The history of the city begins in the third century, when a small settlement of fishermen grew along "
    "the river. Over the next thousand years it became a center of trade, learning and art, and its "
    "cathedral, libraries and markets drew travellers from every part of the continent and beyond."
)
HEADERS = (
    "model",
    "weights",
    "ours decode ms",
    "GenAI decode ms",
    "ours / GenAI decode",
    "ours prefill ms",
    "GenAI prefill ms",
    "ours / GenAI prefill",
    "ours MB / GenAI MB",
    "peak MB ours / GenAI",
    "MB after the calls, ours / GenAI",
    "of which the model, ours / GenAI",
    "greedy tokens equal",
)


def anchors_python() -> Path:
    """The anchors' interpreter, its environment made on first use."""
    python = ENVIRONMENT / "bin" / "python"
    done = ENVIRONMENT / "installed.json"
    wanted = json.dumps([*ANCHOR_PACKAGES, *NO_DEPS])
    if done.is_file() and done.read_text() == wanted:
        return python
    logger.warning("making the anchors' environment in %s (llama-cpp-python compiles: minutes)", ENVIRONMENT)
    venv.create(ENVIRONMENT, with_pip=True, clear=True)
    pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, *ANCHOR_PACKAGES], check=True)
    subprocess.run([*pip, "--no-deps", *NO_DEPS], check=True)
    done.write_text(wanted)
    return python


def genai_model(checkpoint: Path, weights: str) -> Path:
    """``optimum-cli export openvino`` of ``checkpoint`` with ``weights``, kept beside it."""
    out = checkpoint.parent / "anchors" / f"{checkpoint.name}-genai-{weights}"
    if (out / "openvino_model.xml").is_file():
        return out
    cli = anchors_python().parent / "optimum-cli"
    command = [str(cli), "export", "openvino", "--model", str(checkpoint), "--task", "text-generation-with-past"]
    command += [*OPTIMUM_WEIGHTS[weights], "--group-size-fallback", "adjust", str(out)]
    logger.warning("exporting %s for GenAI (%s)", checkpoint.name, weights)
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return out


def our_program(checkpoint: Path, weights: str) -> Path:
    """``export-llm``'s program of ``checkpoint`` with ``weights`` at context ``CONTEXT``, kept beside it.
    Exported by the command a user runs, in a process of its own: the memory one export leaves
    behind is not there for the next (three in one process did not fit 24 GiB at the working size)."""
    options = OURS_WEIGHTS[weights]
    name = "-".join([checkpoint.name, "ours", weights, *(option.strip("-") for option in options)])
    out = checkpoint.parent / "anchors" / f"{name}.pte"
    if out.is_file():
        return out
    logger.warning("exporting %s with export-llm (%s)", checkpoint.name, weights)
    out.parent.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-m", "openvino_backend", "export-llm", str(checkpoint)]
    command += ["--max-seq-len", str(CONTEXT), "--weights", weights, *options, "-o", str(out)]
    done = subprocess.run(command, capture_output=True, text=True, env=child_env())
    if done.returncode:
        out.unlink(missing_ok=True)
        how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit {done.returncode}"
        said = done.stderr.strip().splitlines()[-1:] or [""]
        raise RuntimeError(f"export-llm failed ({how}): {said[0]}")
    return out


def working_checkpoint() -> Path:
    """A Llama at the working size (``WORKING``) with random weights (seed 0), as a Hugging Face directory."""
    out = ROOT / "llama-2048x16"
    if (out / "config.json").is_file() and (out / "model.safetensors").is_file():
        return out
    import torch
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    model = LlamaForCausalLM(LlamaConfig(**WORKING, tie_word_embeddings=False)).eval()
    model.save_pretrained(out)
    # GenAI's pipeline wants a tokenizer beside the model; no text passes through it here.
    AutoTokenizer.from_pretrained(checkpoint_directory()).save_pretrained(out)
    return out


def prompt_ids(checkpoint: Path, vocab: int | None = None, count: int = PROMPT_TOKENS) -> list[int]:
    """``count`` token ids of ``TEXT``, repeated as often as it takes (every id below ``vocab``, if given)."""
    from transformers import AutoTokenizer

    ids = AutoTokenizer.from_pretrained(checkpoint)(TEXT).input_ids
    if not ids:
        raise RuntimeError("the prompt text gives no tokens")
    return [i % vocab if vocab else i for i in itertools.islice(itertools.cycle(ids), count)]


def check_prompt_tokens(count: int) -> None:
    """A prompt of ``count`` tokens and ``TOKENS`` more must fit the programs' context."""
    longest = CONTEXT - TOKENS - 1
    if not 1 <= count <= longest:
        raise ValueError(f"prompt of {count} tokens: give 1 to {longest} ({TOKENS} tokens follow it in {CONTEXT})")


def measure(kind: str, model: Path, prompt: list[int], options: tuple[str, ...] = ()) -> dict:
    """One contender in a fresh process: its JSON answer (or ``error``, with ``exit``: a negative one is
    the signal that killed it)."""
    python = sys.executable if kind == "ours" else str(anchors_python())
    command = [python, str(WORKER), kind, str(model), "--prompt", ",".join(map(str, prompt))]
    command += ["--tokens", str(TOKENS), "--context", str(CONTEXT), *options]
    # The worker imports the package from its source tree, whichever directory the bench runs from.
    env = child_env()
    if kind != "ours":  # bench/__init__.py's passive OpenMP waiting is for PyTorch; llama.cpp's threads need theirs
        env.pop("OMP_WAIT_POLICY", None)
    return run_child(command, timeout=1800, env=env)


def measure_llamacpp(model: Path, prompt: list[int], options: list[str]) -> dict:
    """llama.cpp as built for this CPU; if that crashes, from then on (``options`` remembers) as
    ``llama-cli --no-repack`` runs it, which is what its user would do. Seen on an Intel Xeon with AMX:
    llama-cpp-python 0.3.36's AMX matmul (``ggml_backend_amx_mul_mat``) dies of SIGSEGV on the first
    prompt, and runs without its extra buffer types."""
    answer = measure("llamacpp", model, prompt, tuple(options))
    if answer.get("exit", 0) < 0 and not options:
        logger.warning("llama.cpp crashed (%s): measured without its extra buffer types from now on", answer["error"])
        options.append(NO_EXTRA_BUFFERS)
        answer = measure("llamacpp", model, prompt, tuple(options))
    return answer


def _size_mb(path: Path) -> float:
    if path.is_file():
        return path.stat().st_size / 1e6
    return sum(p.stat().st_size for p in path.glob("openvino_model.*")) / 1e6


def _equal_prefix(a: list[int], b: list[int]) -> str:
    same = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return "all" if same == len(a) == len(b) else f"first {same} of {len(a)}"


def bench_anchors(
    working_size: bool = False,
    weights_kept: tuple[str, ...] = WEIGHTS,
    rounds: int = ROUNDS,
    prompt_tokens: int = PROMPT_TOKENS,
) -> tuple[list[tuple], list[tuple], str]:
    """Rows per (model, weights) against GenAI, for ``weights_kept``; llama.cpp's row against ours int4
    (when int4 is kept); what was run. Decode is timed after a prompt of ``prompt_tokens``: a long one
    times each token over a long cache."""
    check_prompt_tokens(prompt_tokens)
    smollm2 = checkpoint_directory()
    models = [("SmolLM2-135M", smollm2, prompt_ids(smollm2, count=prompt_tokens))]
    if working_size:
        working_prompt = prompt_ids(smollm2, WORKING["vocab_size"], prompt_tokens)
        models.append(("Llama 2048x16", working_checkpoint(), working_prompt))
    contenders = []  # (model name, weights, kind, path, prompt)
    for name, checkpoint, prompt in models:
        for weights in weights_kept:
            try:
                program: Path | None = our_program(checkpoint, weights)
            except Exception as error:  # e.g. f32 at the working size: over the 2 GiB an inline program holds
                logger.error("%s %s: ours not exported: %s", name, weights, str(error).splitlines()[0])
                program = None
            contenders.append((name, weights, "ours", program, prompt))
            contenders.append((name, weights, "genai", genai_model(checkpoint, weights), prompt))
    llama = ("SmolLM2-135M", "Q4_1", "llamacpp", gguf_file(), models[0][2])
    if "int4" in weights_kept:
        contenders.append(llama)
    results: dict[tuple, list[dict]] = {c[:3]: [] for c in contenders}
    llama_options: list[str] = []
    for round_ in range(rounds):
        order = contenders[round_ % len(contenders) :] + contenders[: round_ % len(contenders)]
        for name, weights, kind, path, prompt in order:
            if path is None:
                answer = {"error": "not exported"}
            elif kind == "llamacpp":
                answer = measure_llamacpp(path, prompt, llama_options)
            else:
                answer = measure(kind, path, prompt)
            if "error" in answer:
                logger.error("%s %s %s: %s", name, weights, kind, answer["error"])
            results[(name, weights, kind)].append(answer)
        logger.warning("round %d of %d done", round_ + 1, rounds)

    def ok(key: tuple) -> list[dict]:
        return [a for a in results[key] if "error" not in a]

    def ratios(a: tuple, b: tuple, field: str) -> list[float]:
        return [x[field] / y[field] for x, y in zip(results[a], results[b], strict=True) if "error" not in x | y]

    rows = []
    for name, _, _ in models:
        for weights in weights_kept:
            ours, genai = (name, weights, "ours"), (name, weights, "genai")
            a, b = ok(ours), ok(genai)
            sizes = [_size_mb(c[3]) if c[3] is not None else 0.0 for c in contenders if c[:2] == (name, weights)]
            rows.append(
                (
                    name,
                    weights,
                    median([x["decode_ms"] for x in a]),
                    median([x["decode_ms"] for x in b]),
                    median(ratios(ours, genai, "decode_ms")),
                    median([x["prefill_ms"] for x in a]),
                    median([x["prefill_ms"] for x in b]),
                    median(ratios(ours, genai, "prefill_ms")),
                    " / ".join(f"{s:.0f}" for s in sizes),
                    f"{median([x['peak_mb'] for x in a])} / {median([x['peak_mb'] for x in b])}",
                    f"{median([x['rss_mb'] for x in a])} / {median([x['rss_mb'] for x in b])}",
                    f"{median(_held(a))} / {median(_held(b))}",
                    _equal_prefix(a[0]["tokens"], b[0]["tokens"]) if a and b else "n/a",
                )
            )
    if "int4" not in weights_kept:
        return rows, [], _what(rounds, prompt_tokens)
    ours4, cpp = ("SmolLM2-135M", "int4", "ours"), llama[:3]
    c = ok(cpp)
    llama_rows = [
        (
            "llama.cpp Q4_1" + (" --no-repack" if llama_options else ""),
            median([x["decode_ms"] for x in c]),
            median(ratios(ours4, cpp, "decode_ms")),
            median([x["prefill_ms"] for x in c]),
            median(ratios(ours4, cpp, "prefill_ms")),
            f"{_size_mb(llama[3]):.0f}",
            median([x["peak_mb"] for x in c]),
        )
    ]
    return rows, llama_rows, _what(rounds, prompt_tokens)


def _held(answers: list[dict]) -> list[float]:
    """What each process held after its calls beyond what it held once its library was imported."""
    return [x["rss_mb"] - x["base_mb"] for x in answers]


def _what(rounds: int, prompt_tokens: int) -> str:
    return (
        f"{prompt_tokens}-token prompts in one call (median of 3), then {TOKENS} greedy tokens; ours at context "
        f"{CONTEXT}; {rounds} interleaved rounds, each contender a fresh process; ratios: median of per-round ratios"
    )


LLAMA_HEADERS = (
    "anchor",
    "decode ms",
    "ours int4 / it, decode",
    "prefill ms",
    "ours int4 / it, prefill",
    "MB",
    "peak MB",
)


def run(working_size: bool, weights: tuple[str, ...], rounds: int, prompt_tokens: int) -> None:
    from openvino_backend.tools.quiet import nncf_off_stdout

    with nncf_off_stdout():
        rows, llama_rows, what = bench_anchors(working_size, weights, rounds, prompt_tokens)
    table(f"Ours against OpenVINO GenAI (optimum-intel's export, the same OpenVINO): {what}", rows, HEADERS)
    if llama_rows:
        table("And llama.cpp on the GGUF SmolLM2-135M comes from", llama_rows, LLAMA_HEADERS)
