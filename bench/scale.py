"""Decoders at the sizes people run: what the export costs, and the program from its file.

``python -m bench --scale [--shapes NAME ...] [--weights f32|int8|int4]``. For each shape (``SHAPES``:
a Llama with the real model's dimensions), a checkpoint of random weights written in bf16 without an
f32 copy (built on the meta device, each tensor drawn in place) under ``~/.cache/openvino_backend/scale``.
Then, each in a process of its own: ``export-llm`` and ``optimum-cli export openvino`` (the anchors'
environment), their peak RSS and seconds; the program from its file through ``executorch.runtime``,
a prompt then eager's greedy tokens, each logits vector within the target precision's tolerance of
eager's (``follow``), and ``TextLLMRunner`` generating the package's generator's tokens; prefill,
decode and run peak of the program and of GenAI's ``LLMPipeline`` on optimum-cli's IR (the anchors'
worker). One table row per shape.
"""

from __future__ import annotations

import json
import mmap
import re
import sys
from pathlib import Path

from bench.anchors import OPTIMUM_WEIGHTS, PROMPT_TOKENS, anchors_python, measure, prompt_ids
from bench.harness import run_measured

ROOT = Path.home() / ".cache" / "openvino_backend" / "scale"
CONTEXT = 2048  # as users export them
PROMPT = 8
STEPS = 6
TEXT = "once upon a time the little robot liked the sea and read books about a boat"  # the tokenizer's

# Llama-shaped decoders (random weights): the dimensions of the models people run, and "over-2gib",
# whose f32 program is over the 2 GiB a flatbuffer holds (the case only segments can write).
_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads")
_ROWS = {  # the fields above, the vocabulary, then whether the head shares the embedding's weights
    "over-2gib": ((2048, 5632, 12, 16, 8), 32000, False),
    "qwen2.5-0.5b": ((896, 4864, 24, 14, 2), 151936, True),
    "llama-3.2-3b": ((3072, 8192, 28, 24, 8), 128256, True),
    "llama-3.1-8b": ((4096, 14336, 32, 32, 8), 128256, False),
}
SHAPES: dict[str, dict[str, int | bool]] = {
    name: {**dict(zip(_FIELDS, sizes, strict=True)), "vocab_size": vocab, "tie_word_embeddings": tied}
    for name, (sizes, vocab, tied) in _ROWS.items()
}


def checkpoint(name: str, root: Path = ROOT) -> Path:
    """``SHAPES[name]`` as a Hugging Face directory: bf16 safetensors of random weights, and a
    tokenizer ``TextLLMRunner`` reads. Written once."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        if not (out / "tokenizer_config.json").is_file():  # written before it had one: GenAI cannot read it
            write_tokenizer(out, vocab_size=json.loads((out / "config.json").read_text())["vocab_size"])
        return out
    config = LlamaConfig(**SHAPES[name], max_position_embeddings=4096, bos_token_id=1, eos_token_id=2)
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.to_empty(device="cpu")  # bf16 storage, nothing drawn yet: no f32 copy at any point
    model.tie_weights()  # to_empty gives the head a tensor of its own
    generator = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for parameter in model.parameters():
            if parameter.dim() == 1:
                parameter.fill_(1.0)  # norms
            else:
                parameter.normal_(0.0, 0.02, generator=generator)
    model.save_pretrained(out)  # rotary frequencies are not saved: the loader computes them
    del model
    write_tokenizer(out, vocab_size=config.vocab_size)
    return out


def _gigabytes(path: Path) -> float:
    files = [path] if path.is_file() else list(path.glob("*.safetensors"))
    return sum(f.stat().st_size for f in files) / 1e9


def write_tokenizer(directory: Path, *, vocab_size: int) -> None:
    """``directory/tokenizer.json`` for ``TextLLMRunner``: a byte-level BPE whose every token is ASCII
    (the runner hands each token's text to its callback on its own), trained on a sentence, padded with
    added tokens to ``vocab_size``; with an unknown token and a ``tokenizer_config.json`` naming the plain
    fast tokenizer, without which OpenVINO's tokenizer (optimum-cli's, GenAI's) fails on any text."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE(unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c.isascii() and c.isprintable()] + ["Ġ"]
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=["<unk>", "<s>", "</s>"], initial_alphabet=alphabet, limit_alphabet=len(alphabet)
    )
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    tokenizer.add_tokens([f"<t{i}>" for i in range(tokenizer.get_vocab_size(), vocab_size)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))
    config = dict(tokenizer_class="PreTrainedTokenizerFast", bos_token="<s>", eos_token="</s>", unk_token="<unk>")
    (directory / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")


def export(directory: Path, weights: str, out: Path) -> dict[str, object]:
    """``export-llm`` of ``directory`` into ``out``, measured."""
    command = [sys.executable, "-m", "openvino_backend", "export-llm", str(directory), "-o", str(out)]
    command += ["--max-seq-len", str(CONTEXT), "--weights", weights, *(["--sym"] if weights == "int8" else [])]
    done, peak, seconds = run_measured(command)
    if done.returncode:
        said = " / ".join((done.stdout + done.stderr).strip().splitlines()[-3:])
        return {"error": f"export-llm exit {done.returncode}: {said}", "export_gb": peak}
    return {"export_gb": peak, "export_s": seconds}


def export_optimum(directory: Path, weights: str, out: Path) -> dict[str, object]:
    """``optimum-cli export openvino`` of ``directory`` with ``weights`` into ``out``, measured."""
    command = [str(anchors_python().parent / "optimum-cli"), "export", "openvino", "--model", str(directory)]
    command += ["--task", "text-generation-with-past", *OPTIMUM_WEIGHTS[weights], str(out)]
    done, peak, seconds = run_measured(command)
    return {"optimum": f"exit {done.returncode}" if done.returncode else f"{peak:.2f} / {seconds:.0f}"}


def follow(directory: Path, program: Path, weights: str) -> dict[str, object]:
    """In this (fresh) process: the program from its file (loaded first: the peak is the run's),
    teacher-forced against eager, and ``TextLLMRunner`` against the package's generator."""
    import torch
    from pytorch_tokenizers import get_tokenizer
    from tokenizers import Tokenizer

    from openvino_backend.blob_import import import_copies_blob
    from openvino_backend.llm.export import export_graph
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.llm.runner import ExecutorchRunner
    from openvino_backend.program import segmented_delegates
    from openvino_backend.runtime import Tolerance, inference_precision

    generator = Generator(program)  # from its file, memory-mapped, as deployments load it
    tokens = list(range(3, 3 + PROMPT))
    got = generator(tokens)
    held = _resident_gb()  # the program after its first call: its weights once, in OpenVINO
    # Eager with the program's weights: compressed ones are compressed again as export-llm did.
    decoder = load_decoder(directory, max_context=CONTEXT, stored_weights=weights != "f32")
    eager = export_graph(decoder, weights=weights, symmetric=weights == "int8").module()
    hidden, precision = SHAPES.get(directory.name, {}).get("hidden_size", 4096), inference_precision("CPU")
    position, worst, failures = 0, 0.0, []
    for step in range(STEPS + 1):
        with torch.no_grad():
            want = eager(torch.tensor([tokens]), torch.tensor([position]))[-1]
        if step:
            got = generator(tokens)
        scale = want.abs().max().item()
        tolerance = Tolerance.for_output(precision, terms=int(hidden), scale=scale, ops=8)
        error = (got - want).abs().max().item()
        # Compressed weights: OpenVINO quantizes the matmuls' activations too (no f32 tolerance holds).
        if weights == "f32" and not tolerance.check(got, want):
            failures.append(f"step {step}: logits off by {error:.3g} (tolerance {tolerance})")
        worst = max(worst, error / max(scale, 1e-12))
        position += len(tokens)
        tokens = [int(want.argmax())]
    del decoder, eager
    prompt, tokenizer_file = "once upon a time", directory / "tokenizer.json"
    ids = list(get_tokenizer(str(tokenizer_file)).encode(prompt, bos=1, eos=0))
    tokenizer = Tokenizer.from_file(str(tokenizer_file))
    ours = [tokenizer.decode([t], skip_special_tokens=False) for t in Generator(program).generate(ids, 8).tokens]
    runner = ExecutorchRunner(program, tokenizer_file).generate(prompt, 8)
    with open(program, "rb") as file, mmap.mmap(file.fileno(), 0, access=mmap.ACCESS_READ) as mapped:
        segments = len(segmented_delegates(mapped))
    return {
        "precision": str(precision).removeprefix("torch."),
        "worst_relative": worst,
        "failures": failures,
        "segments": segments,
        "held_gb": held,
        "import_copies": import_copies_blob(),
        "runner_agrees": bool(ours) and runner.pieces[: len(ours)] == ours,
    }


def _resident_gb() -> float:
    return int(re.search(r"VmRSS:\s+(\d+)", Path("/proc/self/status").read_text()).group(1)) / 1e6


def bench_scale(names: list[str], weights: str) -> list[tuple]:
    """One row per shape (``python -m bench --scale``)."""
    rows = []
    for name in names:
        directory = checkpoint(name)
        program = ROOT / f"{name}-{weights}.pte"
        intermediate = ROOT / f"{name}-{weights}-ov"
        exported = export(directory, weights, program) | export_optimum(directory, weights, intermediate)
        if "error" in exported:
            gb = f"{exported['export_gb']:.2f}"
            rows.append((name, weights, f"{_gigabytes(directory):.2f}", gb, exported["optimum"], *"-" * 6))
            rows.append(("", "", "", str(exported["error"])[:200], *[""] * 7))
            continue
        check, _, _ = run_measured([sys.executable, "-m", "bench.scale", str(directory), str(program), weights])
        lines = [line for line in check.stdout.splitlines() if line.startswith("{")]
        verdict = json.loads(lines[-1]) if check.returncode == 0 and lines else None
        followed = (
            f"exit {check.returncode}: {check.stderr.strip().splitlines()[-1:] or ''}"
            if verdict is None
            else ("follows eager" if not verdict["failures"] else "; ".join(verdict["failures"][:2]))
            + f", worst {verdict['worst_relative']:.1e} rel. ({weights} weights, {verdict['precision']})"
            + ("; TextLLMRunner agrees" if verdict["runner_agrees"] else "; TextLLMRunner DIFFERS")
        )
        layout = "-" if verdict is None else ("segments" if verdict["segments"] else "inline")
        cells = [name, weights, f"{_gigabytes(directory):.2f}"]
        cells += [f"{exported['export_gb']:.2f} / {exported['export_s']:.0f}", exported["optimum"]]
        cells += [f"{program.stat().st_size / 2**30:.2f} GiB, {layout}"]
        cells += ["-" if verdict is None else f"{verdict['held_gb']:.2f}", followed]
        rows.append((*cells, *speeds(directory, program, intermediate)))
    return rows


def speeds(directory: Path, program: Path, intermediate: Path) -> tuple[str, str, str]:
    """Prefill, decode (median ms a token) and run peak: the program's / GenAI's on optimum-cli's IR."""
    prompt = prompt_ids(directory)
    ours, genai = measure("ours", program, prompt), measure("genai", intermediate, prompt)
    if "error" in ours or "error" in genai:
        return ("; ".join(str(a.get("error", ""))[:120] for a in (ours, genai)), "-", "-")
    return tuple(  # type: ignore[return-value]
        f"{ours[field] / scale:.{digits}f} / {genai[field] / scale:.{digits}f}"
        for field, scale, digits in (("prefill_ms", 1, 0), ("decode_ms", 1, 1), ("peak_mb", 1000, 2))
    )


HEADERS = (
    *("shape", "weights", "checkpoint GB (bf16)", "export peak GB / s", "optimum-cli's", "program"),
    *("held after the first call GB", "from its file, teacher-forced"),
    *(f"prefill ms ({PROMPT_TOKENS} tokens), ours / GenAI's", "decode ms a token, ours / GenAI's"),
    "run peak GB, ours / GenAI's",
)


def run(names: list[str], weights: list[str]) -> None:
    from bench.harness import table

    rows = [row for w in weights for row in bench_scale(names, w)]
    title = "Decoders at real sizes (random weights): export-llm, then the program from its file in a fresh process"
    table(title, rows, HEADERS)


if __name__ == "__main__":  # the check, in a fresh interpreter: python -m bench.scale DIRECTORY PROGRAM WEIGHTS
    print(json.dumps(follow(Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3])))
