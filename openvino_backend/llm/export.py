"""A decoder to a ``.pte`` lowered by this backend: one program that prefills a prompt of any
length in one call and decodes, its KV cache in OpenVINO state."""

from __future__ import annotations

import logging

import torch
from executorch.exir import ExecutorchProgramManager, to_edge_transform_and_lower

from openvino_backend.llm.models import Decoder
from openvino_backend.partition.partitioner import OpenvinoPartitioner

logger = logging.getLogger(__name__)


def example_inputs(decoder: Decoder, prompt: int = 3) -> tuple[torch.Tensor, torch.Tensor]:
    """A ``prompt``-token input at position 0, ids within the vocabulary."""
    tokens = torch.arange(prompt, dtype=torch.long).reshape(1, prompt) % decoder.vocab_size
    return tokens, torch.tensor([0], dtype=torch.long)


def metadata(decoder: Decoder, dynamic: bool) -> dict[str, object]:
    """Constant methods ExecuTorch's LLM runners read (``get_max_seq_len``, ...)."""
    values: dict[str, object] = {
        "get_max_seq_len": decoder.max_context,
        "get_max_context_len": decoder.max_context,
        "get_vocab_size": decoder.vocab_size,
        "use_kv_cache": True,
        "enable_dynamic_shape": dynamic,
    }
    if decoder.bos_id is not None:
        values["get_bos_id"] = decoder.bos_id
    if decoder.eos_ids:
        values["get_eos_ids"] = list(decoder.eos_ids)
    return values


def export_decoder(
    decoder: Decoder, *, dynamic: bool = True, partitioner: OpenvinoPartitioner | None = None
) -> ExecutorchProgramManager:
    """Export and lower ``decoder``. ``dynamic``: prompts of 1 to ``max_context - 1`` tokens in one
    call; otherwise one token per call."""
    inputs = example_inputs(decoder, 3 if dynamic else 1)
    shapes = ({1: torch.export.Dim("prompt", min=1, max=decoder.max_context - 1)}, None) if dynamic else None
    with torch.no_grad():
        exported = torch.export.export(decoder.module, inputs, dynamic_shapes=shapes, strict=decoder.strict)
    # The numerical check runs on a real prompt at position 0 (drawn positions could be negative).
    partitioner = partitioner or OpenvinoPartitioner(sample_inputs=inputs)
    edge = to_edge_transform_and_lower(exported, partitioner=[partitioner], constant_methods=metadata(decoder, dynamic))
    report = partitioner.report
    logger.info(
        "%s: %d of %d ops in OpenVINO, %d buffer(s) kept as OpenVINO state",
        decoder.name,
        report.delegated_nodes,
        report.total_nodes,
        len(report.state_buffers),
    )
    return edge.to_executorch()
