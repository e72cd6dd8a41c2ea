"""Every causal-LM family ``transformers`` offers, through ``export-llm`` (``python -m bench --families``).

Each family is built from its config class at a small size (2 layers, hidden
64, random weights), exported by the recipe and run on ExecuTorch's runtime
against eager: a 6-token prompt in one call, then 6 decode calls fed eager's
choices, every logits vector within the target precision's tolerance. Each
family runs in its own process (one family's crash or hang is its own row).
The verdicts are what docs/llm.md lists; the test matrix
(``tests/test_families.py``, with its own copy of the builder) runs the families that export.
"""

from __future__ import annotations

import copy
import json
import sys
import tempfile
import time
from pathlib import Path

from bench.harness import answer_stream, run_child, table

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


def run() -> None:
    """Every family's verdict, each in a fresh process (``python -m bench.families FAMILY``: one JSON line)."""
    rows = []
    for family in causal_families():
        row = run_child([sys.executable, "-m", "bench.families", family], timeout=TIMEOUT)
        if "error" in row:
            row = {"family": family, "status": "fails", "detail": row["error"]}
        print(json.dumps(row), file=sys.stderr, flush=True)
        rows.append(row)
    title = f"Every causal-LM family of transformers, 2 layers, hidden 64, context {CONTEXT}, random weights"
    table(title, [[r["family"], r["status"], r["detail"]] for r in rows], ("family", "status", "why"))
    counts = {status: sum(r["status"] == status for r in rows) for status in ("follows eager", "refused", "fails")}
    print("\n" + ", ".join(f"{count} {status}" for status, count in counts.items()))


if __name__ == "__main__":
    out = answer_stream()
    print(json.dumps(verdict(sys.argv[1])), file=out)
