"""Decoders at the sizes people run: what the export costs, and the program from its file.

``python -m bench --scale [--shapes NAME ...] [--weights f32|int8|int4]``. For each shape
(``SHAPES``: a Llama with the real model's dimensions), a checkpoint with random weights is written
in bf16 without ever holding an f32 copy (built on the meta device, each tensor drawn in place),
kept in ``~/.cache/openvino_backend/scale``. Then, each in a process of its own:

* ``export-llm`` writes the program as a user would (peak RSS and seconds of that process);
* a fresh interpreter loads the program from its file through ``executorch.runtime`` and feeds it
  a prompt and then, one call each, eager's own greedy tokens (teacher forcing): every logits vector
  must be within the target precision's tolerance of eager's (``follow``);
* ExecuTorch's ``TextLLMRunner`` generates from the same file, and its tokens must be the ones the
  package's own generator picks from that program.

The table: checkpoint GB, export peak GB and seconds, program GB and layout, what the process
holds once the program has run its first call (before eager is loaded: the program's weights once,
in OpenVINO, and the interpreter), the worst relative logits error, and whether the runner agreed.
"""

from __future__ import annotations

import json
import mmap
import sys
from pathlib import Path

from bench.harness import run_measured

ROOT = Path.home() / ".cache" / "openvino_backend" / "scale"
CONTEXT = 128
PROMPT = 8
STEPS = 6
TEXT = "once upon a time the little robot liked the sea and read books about a boat"  # the tokenizer's

# Llama-shaped decoders (random weights). "over-2gib": its f32 program is over the 2 GiB a
# flatbuffer holds, the case only segments can write.
SHAPES: dict[str, dict[str, int]] = {
    "over-2gib": {
        "hidden_size": 2048,
        "intermediate_size": 5632,
        "num_hidden_layers": 12,
        "num_attention_heads": 16,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
    },
}


def checkpoint(name: str, root: Path = ROOT) -> Path:
    """``SHAPES[name]`` as a Hugging Face directory: bf16 safetensors of random weights, and a
    tokenizer ``TextLLMRunner`` reads. Written once."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    out = root / name
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    config = LlamaConfig(
        **SHAPES[name], max_position_embeddings=4096, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False
    )
    with torch.device("meta"):
        model = LlamaForCausalLM(config).to(torch.bfloat16)
    model.to_empty(device="cpu")  # bf16 storage, nothing drawn yet: no f32 copy at any point
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
    (each token's text stands on its own, as the runner hands it to its callback), trained on a
    sentence, padded with added tokens up to ``vocab_size`` (every id the model emits has a text)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    alphabet = [c for c in pre_tokenizers.ByteLevel.alphabet() if c.isascii() and c.isprintable()] + ["Ġ"]
    special = ["<unk>", "<s>", "</s>"]
    trainer = trainers.BpeTrainer(
        vocab_size=200, special_tokens=special, initial_alphabet=alphabet, limit_alphabet=len(alphabet)
    )
    tokenizer.train_from_iterator([TEXT] * 20, trainer)
    tokenizer.add_tokens([f"<t{i}>" for i in range(tokenizer.get_vocab_size(), vocab_size)])
    directory.mkdir(parents=True, exist_ok=True)
    tokenizer.save(str(directory / "tokenizer.json"))


def export(directory: Path, weights: str, out: Path) -> dict[str, object]:
    """``export-llm`` of ``directory`` into ``out``, measured."""
    command = [sys.executable, "-m", "openvino_backend", "export-llm", str(directory), "-o", str(out)]
    command += ["--max-seq-len", str(CONTEXT), "--weights", weights]
    done, peak, seconds = run_measured(command)
    if done.returncode:
        said = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return {"error": f"export-llm exit {done.returncode}: {' / '.join(said)}", "export_gb": peak}
    return {"export_gb": peak, "export_s": seconds}


def follow(directory: Path, program: Path) -> dict[str, object]:
    """In this (fresh) process: the program from its file, teacher-forced against eager, and
    ``TextLLMRunner`` against the package's generator. Loads the program first (its peak is the
    run's), then the eager model."""
    import torch
    from pytorch_tokenizers import get_tokenizer
    from tokenizers import Tokenizer

    from openvino_backend.blob_import import import_copies_blob
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.llm.runner import ExecutorchRunner
    from openvino_backend.program import segmented_delegates
    from openvino_backend.runtime import Tolerance, inference_precision

    generator = Generator(program)  # from its file, memory-mapped, as deployments load it
    tokens = list(range(3, 3 + PROMPT))
    got = generator(tokens)
    held = _resident_gb()  # the program after its first call: its weights once, in OpenVINO
    decoder = load_decoder(directory, max_context=CONTEXT)
    hidden = SHAPES[directory.name]["hidden_size"] if directory.name in SHAPES else 4096
    precision = inference_precision("CPU")
    position, worst, failures = 0, 0.0, []
    for step in range(STEPS + 1):
        with torch.no_grad():
            want = decoder.module(torch.tensor([tokens]), torch.tensor([position]))[-1]
        if step:
            got = generator(tokens)
        scale = want.abs().max().item()
        tolerance = Tolerance.for_output(precision, terms=hidden, scale=scale, ops=8)
        error = (got - want).abs().max().item()
        if not tolerance.check(got, want):
            failures.append(f"step {step}: logits off by {error:.3g} (tolerance {tolerance})")
        worst = max(worst, error / max(scale, 1e-12))
        position += len(tokens)
        tokens = [int(want.argmax())]
    del decoder
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
    status = Path("/proc/self/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("VmRSS:"))) / 1e6


def bench_scale(names: list[str], weights: str) -> list[tuple]:
    """One row per shape (``python -m bench --scale``)."""
    rows = []
    for name in names:
        directory = checkpoint(name)
        program = ROOT / f"{name}-{weights}.pte"
        exported = export(directory, weights, program)
        if "error" in exported:
            rows.append((name, weights, f"{_gigabytes(directory):.2f}", f"{exported['export_gb']:.2f}", "-", "-", "-"))
            rows.append(("", "", "", str(exported["error"])[:200], "", "", ""))
            continue
        check, _, _ = run_measured([sys.executable, "-m", "bench.scale", str(directory), str(program)])
        lines = [line for line in check.stdout.splitlines() if line.startswith("{")]
        verdict = json.loads(lines[-1]) if check.returncode == 0 and lines else None
        followed = (
            f"exit {check.returncode}: {check.stderr.strip().splitlines()[-1:] or ''}"
            if verdict is None
            else ("follows eager" if not verdict["failures"] else "; ".join(verdict["failures"]))
            + f", worst {verdict['worst_relative']:.1e} rel. in {verdict['precision']}"
            + ("; TextLLMRunner agrees" if verdict["runner_agrees"] else "; TextLLMRunner DIFFERS")
        )
        layout = "-" if verdict is None else ("segments" if verdict["segments"] else "inline")
        rows.append(
            (
                name,
                weights,
                f"{_gigabytes(directory):.2f}",
                f"{exported['export_gb']:.2f} / {exported['export_s']:.0f}",
                f"{program.stat().st_size / 2**30:.2f} GiB, {layout}",
                "-" if verdict is None else f"{verdict['held_gb']:.2f}",
                followed,
            )
        )
    return rows


HEADERS = (
    "shape",
    "weights",
    "checkpoint GB (bf16)",
    "export peak GB / s",
    "program",
    "held after the first call GB",
    "from its file, teacher-forced",
)


def run(names: list[str], weights: list[str]) -> None:
    from bench.harness import table

    rows = [row for w in weights for row in bench_scale(names, w)]
    title = "Decoders at real sizes (random weights): export-llm, then the program from its file in a fresh process"
    table(title, rows, HEADERS)


if __name__ == "__main__":  # the check, in a fresh interpreter: python -m bench.scale DIRECTORY PROGRAM
    print(json.dumps(follow(Path(sys.argv[1]), Path(sys.argv[2]))))
