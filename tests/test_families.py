"""Decoder families of ``transformers`` through the LLM recipe, each against eager.

Small random models (``bench/families.py`` builds them): each family exports,
runs from its file on ExecuTorch's runtime, and follows eager through a
prompt in one call and six decode calls, within the target precision. The
sweep over every causal-LM family, with the reasons of those refused, is
``python -m bench --families`` (docs/llm.md lists it).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.families import follow_eager

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


@pytest.mark.parametrize("family", FAMILIES)
def test_family_exports_and_follows_eager(family: str, tmp_path: Path) -> None:
    worst = follow_eager(family, tmp_path / family)
    assert worst < 0.05, f"{family}: relative logits error {worst:.3g}"


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
