"""Decoder LLMs as one exportable interface: ``forward(tokens, start) -> logits``.

``tokens`` is ``[1, S]`` (a prompt, or one new token), ``start`` is ``[1]``,
the position of its first token; the result is the next-token logits
``[1, vocab]``. The KV cache is a buffer the model updates, which the
partitioner hands to OpenVINO as state (``lowering/state.py``).

Two sources:

* ExecuTorch's example Llama (``executorch.examples.models.llama``): a
  ``params.json`` (the model's hyper-parameters), with an optional checkpoint;
  random weights without one.
* A Hugging Face ``transformers`` decoder (Llama, Qwen2, Phi-3, ...) from a
  local directory: its weights when the directory has them, random weights
  from its ``config.json`` otherwise. Needs ``transformers`` (the ``llm``
  extra).
"""

from __future__ import annotations

import inspect
import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model")
HF_WEIGHTS = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")


class ModelSourceError(ValueError):
    """What was given as a model is not one this recipe can build."""


class UnsupportedDecoderError(ModelSourceError):
    """A decoder this stack cannot export: torch.export or ExecuTorch's IR refuses it (the family and
    the reason in the message)."""


@dataclass
class Decoder:
    """An exportable decoder and what a runner needs to know about it."""

    module: torch.nn.Module
    name: str
    vocab_size: int
    max_context: int
    # torch.export's mode: Hugging Face's static cache exports only with strict (dynamo) tracing.
    strict: bool = False
    tokenizer: Path | None = None
    bos_id: int | None = None
    eos_ids: list[int] = field(default_factory=list)
    # ``load_decoder(..., stored_weights=True)``: the checkpoint's weights in its own dtype, by parameter
    # name in ``module``, whose parameters are then f32 stand-ins never written or read: ``module`` has
    # the model's shapes and computations but not its weights, which ``export_graph`` takes from here.
    stored: dict[str, torch.Tensor] | None = None
    # A streamed export (``export_graph``) lets the stored weights go once compressed: no longer exportable.
    released: bool = False


class _ExamplesLlama(torch.nn.Module):
    def __init__(self, transformer: torch.nn.Module) -> None:
        super().__init__()
        self.transformer = transformer

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        return self.transformer(tokens, attn_options={"input_pos": start})


class _HuggingFaceDecoder(torch.nn.Module):
    def __init__(self, cached: torch.nn.Module) -> None:
        super().__init__()
        self.cached = cached

    def forward(self, tokens: torch.Tensor, start: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(tokens.shape[1], dtype=torch.long) + start
        return self.cached(input_ids=tokens, cache_position=positions)[:, -1, :]


def load_decoder(
    source: Path, *, checkpoint: Path | None = None, max_context: int = 128, stored_weights: bool = False
) -> Decoder:
    """The decoder ``source`` describes: a ``params.json`` (or a directory holding one) for
    ExecuTorch's example Llama, or a directory with a Hugging Face ``config.json``.

    ``stored_weights`` (Hugging Face directories with weights): the weights stay as the checkpoint
    stores them (memory-mapped, in its dtype) in ``Decoder.stored``, and the module traces with f32
    stand-ins: no f32 copy of the model is made unless the export needs one (``export_graph``)."""
    if max_context < 2:
        raise ModelSourceError(f"max_context {max_context}: a decoder needs a context of at least 2 tokens")
    source = Path(source)
    if not source.exists():
        raise ModelSourceError(f"{source}: no such file or directory")
    if source.is_file() and source.suffix == ".json":
        return examples_llama(source, checkpoint=checkpoint, max_context=max_context)
    if source.is_dir() and (source / "config.json").exists():
        if checkpoint is not None:
            raise ModelSourceError(
                "--checkpoint is for ExecuTorch's example Llama; a Hugging Face directory holds its own"
            )
        return hugging_face_decoder(source, max_context=max_context, stored_weights=stored_weights)
    if source.is_dir() and (source / "params.json").exists():
        found = checkpoint or next(iter(sorted(source.glob("*.pth"))), None)
        return examples_llama(source / "params.json", checkpoint=found, max_context=max_context)
    raise ModelSourceError(
        f"{source}: expected a params.json (ExecuTorch's example Llama), or a directory holding one, "
        "or a Hugging Face model directory (with config.json)"
    )


def examples_llama(params: Path, *, checkpoint: Path | None = None, max_context: int = 128) -> Decoder:
    from executorch.examples.models.llama.llama_transformer import construct_transformer
    from executorch.examples.models.llama.model_args import ModelArgs

    try:
        fields = json.loads(Path(params).read_text())
    except (OSError, json.JSONDecodeError) as error:
        raise ModelSourceError(f"{params}: cannot read the model's parameters ({error})") from error
    known = set(ModelArgs.__dataclass_fields__)
    unknown = sorted(set(fields) - known)
    if unknown:
        logger.warning("%s: ignoring fields ExecuTorch's Llama does not know: %s", params, ", ".join(unknown))
    fields = {k: v for k, v in fields.items() if k in known}
    fields.update(
        use_kv_cache=True,
        enable_dynamic_shape=True,  # one program prefills a prompt of any length and decodes
        max_seq_len=max_context,
        max_context_len=max_context,
        generate_full_logits=False,
    )
    args = ModelArgs(**fields)
    with torch.random.fork_rng():
        torch.manual_seed(0)  # random weights (no checkpoint) are the same on every export
        transformer = construct_transformer(args)
    if checkpoint is not None:
        _load_checkpoint(transformer, checkpoint)
    directory = Path(params).parent
    return Decoder(
        module=_ExamplesLlama(transformer.eval()),
        name=f"llama-{args.dim}x{args.n_layers}",
        vocab_size=args.vocab_size,
        max_context=max_context,
        tokenizer=_tokenizer_in(directory),
    )


def _load_checkpoint(transformer: torch.nn.Module, checkpoint: Path) -> None:
    try:
        state = torch.load(checkpoint, map_location="cpu", weights_only=True, mmap=True)
    except Exception as error:  # a missing file, or not a torch checkpoint
        raise ModelSourceError(f"{checkpoint}: cannot load the checkpoint ({error})") from error
    state = state.get("model", state) if isinstance(state, dict) else state
    missing, unexpected = transformer.load_state_dict(state, strict=False)
    # The KV cache, masks and rotary tables are buffers no checkpoint holds.
    params = {name for name, _ in transformer.named_parameters()}
    missing_weights = sorted(set(missing) & params)
    if missing_weights or unexpected:
        raise ModelSourceError(
            f"{checkpoint} does not fit the model of its params.json: missing {missing_weights[:4]}, "
            f"unexpected {sorted(unexpected)[:4]}"
        )


def hugging_face_decoder(directory: Path, *, max_context: int = 128, stored_weights: bool = False) -> Decoder:
    try:
        from transformers import GenerationConfig
        from transformers.integrations.executorch import TorchExportableModuleWithStaticCache
    except ImportError as error:
        raise ModelSourceError(
            "a Hugging Face model needs transformers: pip install 'openvino-backend[llm]'"
        ) from error
    config = _decoder_config(directory)
    family = config.model_type
    stored_weights = stored_weights and any((directory / name).exists() for name in HF_WEIGHTS)
    try:
        model = _causal_lm(directory, config, dtype="auto" if stored_weights else torch.float32)
        stand_ins = _stand_ins(model) if stored_weights else {}
        if model._can_set_experts_implementation():
            # Mixture of experts: the default routing counts tokens per expert with histc (no core ATen
            # op) and loops over the experts hit (data-dependent shapes); batched_mm gathers each token's
            # experts and multiplies them in one batched matmul: the same result, static shapes.
            model.set_experts_implementation("batched_mm")
        model = model.to(torch.float32).eval()
        if "logits_to_keep" in inspect.signature(model.forward).parameters:
            # The program returns the last position's logits: only that row goes through the head
            # (a prompt of S tokens would otherwise multiply S rows by the vocabulary's weights).
            model.register_forward_pre_hook(_last_logits_only, with_kwargs=True)
        model.generation_config = GenerationConfig(
            use_cache=True, cache_implementation="static", cache_config={"batch_size": 1, "max_cache_len": max_context}
        )
        cached = TorchExportableModuleWithStaticCache(model, batch_size=1, max_cache_len=max_context)
    except ModelSourceError:
        raise
    except Exception as error:  # transformers' own verdict on this family or this config
        text = str(error).strip()
        reason = f"{type(error).__name__}: {text.splitlines()[0][:300]}" if text else type(error).__name__
        raise UnsupportedDecoderError(
            f"{family}: transformers cannot build it with a static KV cache, which the export needs ({reason})"
        ) from error
    text = config.get_text_config()
    eos_ids = getattr(text, "eos_token_id", None)  # not every family's config has one
    eos = eos_ids if isinstance(eos_ids, list) else [eos_ids]
    module = _HuggingFaceDecoder(cached).eval()
    stored = None
    if stored_weights:
        named = module.named_parameters(remove_duplicate=False)
        stored = {name: stand_ins[id(p)] for name, p in named if id(p) in stand_ins}
    return Decoder(
        module=module,
        stored=stored,
        name=f"{config.model_type}-{directory.name}",
        vocab_size=text.vocab_size,
        max_context=max_context,
        strict=True,
        tokenizer=_tokenizer_in(directory),
        bos_id=getattr(text, "bos_token_id", None),
        eos_ids=[e for e in eos if e is not None],
    )


def _last_logits_only(
    module: torch.nn.Module, args: tuple[object, ...], kwargs: dict[str, object]
) -> tuple[tuple[object, ...], dict[str, object]]:
    """A forward pre-hook: transformers' ``logits_to_keep=1``, the head applied to the last position
    alone (what ``generate`` asks for itself while decoding)."""
    return args, {**kwargs, "logits_to_keep": 1}


def _decoder_config(directory: Path) -> object:
    """The directory's config, if it describes a decoder-only language model; refused by name otherwise."""
    from transformers import AutoConfig
    from transformers.models.auto.modeling_auto import (
        MODEL_FOR_CAUSAL_LM_MAPPING_NAMES,
        MODEL_FOR_MASKED_LM_MAPPING_NAMES,
    )

    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, OSError, KeyError) as error:  # transformers' verdicts on the config itself
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise ModelSourceError(f"{directory / 'config.json'}: transformers cannot read it ({first})") from error
    family = config.model_type
    architectures = [a for a in (getattr(config, "architectures", None) or [])]
    causal = any(a.endswith(("ForCausalLM", "LMHeadModel", "ForConditionalGeneration")) for a in architectures)
    if getattr(config, "is_encoder_decoder", False):
        raise ModelSourceError(
            f"{directory}: an encoder-decoder model ({family}): export-llm exports decoder-only models; "
            "export its encoder with `lower` (transformers' AutoModel), or use ExecuTorch's seq2seq recipes"
        )
    if family in MODEL_FOR_MASKED_LM_MAPPING_NAMES and not causal:
        raise ModelSourceError(
            f"{directory}: an encoder-only model ({family}): export it with `lower` "
            "(an embedding model: transformers' AutoModel, a dynamic sequence length)"
        )
    if family not in MODEL_FOR_CAUSAL_LM_MAPPING_NAMES:
        raise ModelSourceError(f"{directory}: transformers has no causal language model for {family!r}")
    return config


def _stand_ins(model: torch.nn.Module) -> dict[int, torch.Tensor]:
    """Replace each floating-point parameter of ``model`` by an f32 one of its shape, allocated but never
    written (no memory is used until it is): by ``id`` of the stand-in, the tensor it stands for. Its
    floating-point buffers (rotary frequencies) become f32, and so does the KV cache built after this."""
    stands: dict[int, torch.Tensor] = {}
    replaced: dict[int, torch.nn.Parameter] = {}  # a tied weight gets one stand-in
    for module in model.modules():
        for name, parameter in list(module.named_parameters(recurse=False)):
            if not parameter.is_floating_point():
                continue
            if id(parameter) not in replaced:
                stand_in = torch.nn.Parameter(torch.empty(parameter.shape, dtype=torch.float32), requires_grad=False)
                replaced[id(parameter)] = stand_in
                stands[id(stand_in)] = parameter.detach()
            setattr(module, name, replaced[id(parameter)])
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None and buffer.is_floating_point():
                module.register_buffer(name, buffer.float(), persistent=name not in module._non_persistent_buffers_set)
    return stands


def _causal_lm(directory: Path, config: object, dtype: torch.dtype | str = torch.float32) -> torch.nn.Module:
    """The model with its weights (random ones, seeded, without), in the first attention form it
    takes: PyTorch's SDPA, else transformers' eager attention (Gemma2 takes only that)."""
    from transformers import AutoModelForCausalLM

    has_weights = any((directory / name).exists() for name in HF_WEIGHTS)
    if not has_weights:
        logger.warning("%s has no weights: the model gets random ones, from its config.json", directory)
    refusals = []
    for attention in ("sdpa", "eager"):
        try:
            if has_weights:
                return AutoModelForCausalLM.from_pretrained(directory, dtype=dtype, attn_implementation=attention)
            with torch.random.fork_rng():
                torch.manual_seed(0)  # the same on every export
                return AutoModelForCausalLM.from_config(config, attn_implementation=attention)
        except ValueError as error:  # "does not support an attention implementation through ..."
            refusals.append(f"{attention}: {str(error).splitlines()[0]}")
    raise ModelSourceError(f"{directory}: no attention form of {config.model_type} loads ({'; '.join(refusals)})")


def _tokenizer_in(directory: Path) -> Path | None:
    return next((directory / name for name in TOKENIZER_FILES if (directory / name).exists()), None)
