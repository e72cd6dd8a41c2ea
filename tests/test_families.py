"""Decoder families of ``transformers`` through the LLM recipe, each against eager.

Small random models (``tests/llm_fixtures.py`` builds them): each family exports,
runs from its file on ExecuTorch's runtime, and gives token for token what
``transformers``' greedy ``generate`` gives, with OpenVINO computing in f32
(in a child process, ``f32_environment``: on a bf16 CPU the default precision
makes near-ties a coin toss). A sample of them also follows eager in the
machine's default precision through a prompt in one call and six decode
calls fed eager's tokens, every logits vector within that precision's
tolerance. The sweep over every causal-LM family, with the reasons of those
refused, is ``python -m bench --families`` (docs/llm.md lists it).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.llm_fixtures import f32_environment, follow_eager

REPOSITORY = Path(__file__).resolve().parent.parent

pytest.importorskip("transformers", reason="Hugging Face decoders need the llm extra")

FAMILIES = (
    "llama",
    "mistral",
    "phi3",
    "gemma",
    "gemma2",  # eager attention: it refuses SDPA
    "gemma3_text",
    "qwen2",
    "qwen3",
    "olmo",
    "olmo2",
    "stablelm",
    "gpt_neox",
    "gpt2",
    "falcon",
    "granite",
    "smollm3",
    "cohere",
    "mixtral",  # mixtures of experts: routed through batched_mm
    "qwen2_moe",
    "qwen3_moe",
)


# In the machine's default precision (bf16 on a CPU with AVX512-BF16 or AMX): dense, eager
# attention, sliding windows, learned positions, experts.
AT_DEFAULT_PRECISION = ("llama", "gemma2", "gemma3_text", "gpt2", "mixtral", "qwen3_moe")


@pytest.fixture(scope="module")
def openvino_in_f32(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    return f32_environment(tmp_path_factory.mktemp("openvino-f32"))


# One family of each kind in the README's pytest (dense, eager attention with soft-capping, learned
# positions, experts); the rest of the sweep in CI's --sweeps.
IN_EVERY_RUN = ("llama", "gemma2", "gpt2", "qwen3_moe")


@pytest.mark.slow
@pytest.mark.parametrize(
    "family", [f if f in IN_EVERY_RUN else pytest.param(f, marks=pytest.mark.sweep) for f in FAMILIES]
)
def test_family_generates_eagers_greedy_tokens_with_openvino_in_f32(
    family: str, openvino_in_f32: dict[str, str], tmp_path: Path
) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "tests.llm_fixtures", family, str(tmp_path)],
        env=openvino_in_f32,
        cwd=REPOSITORY,
        capture_output=True,
        text=True,
        timeout=900,
    )
    lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
    assert done.returncode == 0 and lines, f"{family}: the child ended with {done.returncode}\n{done.stderr[-3000:]}"
    row = json.loads(lines[-1])
    assert row["precision"] == "torch.float32", f"the child's OpenVINO computes in {row['precision']}"
    assert row["ours"] == row["eager"], f"{family}: greedy tokens differ from transformers' generate"
    assert row["ours"], f"{family}: no token generated"


@pytest.mark.parametrize(
    "family", [f if f == "llama" else pytest.param(f, marks=pytest.mark.slow) for f in AT_DEFAULT_PRECISION]
)
def test_family_follows_eager_at_the_default_precision(family: str, tmp_path: Path) -> None:
    worst = follow_eager(family, tmp_path / family)
    assert worst < 0.05, f"{family}: relative logits error {worst:.3g}"


@pytest.mark.slow
def test_an_encoder_only_directory_lowers_for_any_sequence_length_and_matches_eager(tmp_path: Path, capsys) -> None:
    import json

    import transformers

    from openvino_backend.tools.cli import main

    transformers.BertConfig(
        hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128, max_position_embeddings=64
    ).save_pretrained(tmp_path)
    assert main(["verify", str(tmp_path), "--draws", "1", "--json"]) == 0
    (model,) = json.loads(capsys.readouterr().out)["models"]
    # The sequence is dynamic: run at its low end, the example's and its high end, each matching eager.
    assert [o["shape"][1] for o in model["outputs"]] == [2, 16, 64]
    assert all(o["verdict"] == "match" for o in model["outputs"])
