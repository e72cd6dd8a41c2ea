"""Every causal-LM family ``transformers`` offers, through ``export-llm`` (``python -m bench --families``).

Each family is built from its config class at a small size (2 layers, hidden
64, random weights), exported by the recipe and run on ExecuTorch's runtime
against eager: a 6-token prompt in one call, then 6 decode calls fed eager's
choices, every logits vector within the target precision's tolerance. Each
family runs in its own process (one family's crash or hang is its own row).
The verdicts are what docs/llm.md lists; the test matrix
(``tests/test_families.py``) runs the families that export.
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SMALL = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "head_dim": 16,
    "vocab_size": 256,
    "max_position_embeddings": 128,
    "pad_token_id": 0,
    "bos_token_id": 1,
    "eos_token_id": 2,
    # mixtures of experts
    "num_local_experts": 4,
    "num_experts": 4,
    "num_experts_per_tok": 2,
    "moe_intermediate_size": 64,
    "shared_expert_intermediate_size": 64,
}
CONTEXT = 64
PROMPT = 6
STEPS = 6
TIMEOUT = 600


def causal_families() -> list[str]:
    from transformers.models.auto.modeling_auto import MODEL_FOR_CAUSAL_LM_MAPPING_NAMES

    return sorted(MODEL_FOR_CAUSAL_LM_MAPPING_NAMES)


def write_family(family: str, directory: Path) -> Path:
    """``family``'s config at the small size, saved (no weights: the recipe draws random ones)."""
    import inspect

    from transformers import CONFIG_MAPPING

    config_class = CONFIG_MAPPING[family]
    # Only what the family's config takes (or names another way): a key it does not know would
    # become a stray attribute (GPT-2 has no key/value heads of its own, Falcon computes head_dim).
    known = set(inspect.signature(config_class.__init__).parameters) | set(getattr(config_class, "attribute_map", {}))
    config_class(**{key: value for key, value in SMALL.items() if key in known}).save_pretrained(directory)
    return directory


def follow_eager(family: str, directory: Path) -> float:
    """Export ``family`` and run it against eager; the worst relative logits error. Raises
    ``AssertionError`` when a step is out of tolerance, and what the recipe raises otherwise."""
    import torch

    from openvino_backend.llm.export import export_decoder
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program
    from openvino_backend.runtime import Tolerance

    decoder = load_decoder(write_family(family, directory), max_context=CONTEXT)
    eager = copy.deepcopy(decoder.module)
    program = directory / "program.pte"
    write_program(export_decoder(decoder), program)
    generator = Generator(program)  # from its file, as deployments load it
    tokens = list(range(3, 3 + PROMPT))
    position, worst = 0, 0.0
    for step in range(STEPS + 1):
        with torch.no_grad():
            want = eager(torch.tensor([tokens]), torch.tensor([position]))[-1]
        got = generator(tokens)
        scale = want.abs().max().item()
        tolerance = Tolerance.for_output(torch.float32, terms=SMALL["hidden_size"], scale=scale, ops=8)
        error = (got - want).abs().max().item()
        assert tolerance.check(got, want), f"step {step}: logits off by {error:.3g} (tolerance {tolerance})"
        worst = max(worst, error / max(scale, 1e-12))
        position += len(tokens)
        tokens = [int(want.argmax())]
    return worst


def greedy(family: str, directory: Path, new_tokens: int = 2 * STEPS) -> dict[str, object]:
    """Greedy tokens of ``family``'s program, run from its file, and of ``transformers``' own
    ``generate(do_sample=False)`` on the same weights and prompt; each stops at its end-of-sequence
    token or after ``new_tokens``. With OpenVINO in f32 (``bench/f32.py``) they must be equal."""
    import torch

    from openvino_backend.llm.export import export_decoder
    from openvino_backend.llm.generate import Generator
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program
    from openvino_backend.runtime import inference_precision

    decoder = load_decoder(write_family(family, directory), max_context=CONTEXT)
    model = copy.deepcopy(decoder.module.cached.model)  # before export: what eager runs is untouched by it
    prompt = list(range(3, 3 + PROMPT))
    with torch.no_grad():
        out = model.generate(torch.tensor([prompt]), max_new_tokens=new_tokens, do_sample=False)
    eager = out[0, len(prompt) :].tolist()
    program = directory / "program.pte"
    write_program(export_decoder(decoder), program)
    ours = Generator(program).generate(prompt, new_tokens).tokens  # from its file, as deployments load it
    return {"family": family, "ours": ours, "eager": eager, "precision": str(inference_precision("CPU"))}


def verdict(family: str) -> dict[str, object]:
    """One family's row: ``status`` follows eager / refused (a typed error) / fails, and why."""
    from openvino_backend.diagnostics import OpenvinoExportError
    from openvino_backend.llm.models import ModelSourceError

    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        try:
            worst = follow_eager(family, Path(tmp) / family)
            row = {"status": "follows eager", "detail": f"max relative logits error {worst:.1e}"}
        except (ModelSourceError, OpenvinoExportError) as error:
            row = {"status": "refused", "detail": f"{type(error).__name__}: {_first_line(error)}"}
        except Exception as error:
            row = {"status": "fails", "detail": f"{type(error).__name__}: {_first_line(error)}"}
    return {"family": family, **row, "seconds": round(time.perf_counter() - start)}


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return (text.splitlines()[0] if text else "")[:200]


def sweep(families: list[str] | None = None) -> list[dict[str, object]]:
    """Every family's verdict, each in a fresh process."""
    rows = []
    for family in families or causal_families():
        try:
            done = subprocess.run(
                [sys.executable, "-m", "bench.families", family], capture_output=True, text=True, timeout=TIMEOUT
            )
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            row = (
                json.loads(lines[-1])
                if lines
                else {"family": family, "status": "fails", "detail": f"the process ended with {done.returncode}"}
            )
        except subprocess.TimeoutExpired:
            row = {"family": family, "status": "fails", "detail": f"over {TIMEOUT} s"}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    return rows


def main() -> int:
    """``python -m bench.families FAMILY``: one JSON line, the family's verdict; with ``--greedy
    DIRECTORY``, its greedy tokens and eager's (``greedy``), the program written in DIRECTORY."""
    import argparse

    from bench import answer_stream

    parser = argparse.ArgumentParser(prog="python -m bench.families")
    parser.add_argument("family")
    parser.add_argument("--greedy", type=Path, metavar="DIRECTORY")
    args = parser.parse_args()
    out = answer_stream()
    row = greedy(args.family, args.greedy / args.family) if args.greedy else verdict(args.family)
    print(json.dumps(row), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
