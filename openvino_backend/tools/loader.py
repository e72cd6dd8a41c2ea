"""Turn what a user names on the command line into a module and example inputs."""

from __future__ import annotations

import importlib
import re
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from openvino_backend.tools.examples import EXAMPLES


class LoadError(Exception):
    """The model could not be loaded; the message says why, in one line."""


@dataclass
class LoadedModel:
    name: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    exported: torch.export.ExportedProgram | None = None
    terms: int = 1
    # Dims the model is exported with as dynamic unless --dynamic says otherwise (an encoder's sequence).
    dynamic: tuple[DynamicDim, ...] = ()


DTYPES = {
    name: getattr(torch, name)
    for name in ("float32", "float16", "bfloat16", "float64", "int64", "int32", "int16", "int8", "uint8", "bool")
}


def parse_shape(text: str) -> tuple[int, ...]:
    try:
        shape = tuple(int(part) for part in text.replace("x", ",").split(",") if part.strip())
    except ValueError:
        raise LoadError(f"--input-shape {text!r}: expected comma-separated integers, e.g. 1,3,224,224") from None
    if not shape or any(d < 0 for d in shape):
        raise LoadError(f"--input-shape {text!r}: expected non-negative sizes")
    return shape


def random_inputs(shapes: Sequence[str], dtypes: Sequence[str], generator: torch.Generator) -> tuple[torch.Tensor, ...]:
    if not shapes:
        raise LoadError("this model carries no example inputs: give --input-shape (once per input)")
    if dtypes and len(dtypes) not in (1, len(shapes)):
        raise LoadError(f"give --dtype once, or once per --input-shape ({len(shapes)})")
    names = list(dtypes) * len(shapes) if len(dtypes) == 1 else list(dtypes) or ["float32"] * len(shapes)
    tensors = []
    for shape_text, dtype_name in zip(shapes, names, strict=True):
        if dtype_name not in DTYPES:
            raise LoadError(f"--dtype {dtype_name!r}: expected one of {', '.join(DTYPES)}")
        tensors.append(_random(parse_shape(shape_text), DTYPES[dtype_name], generator))
    return tuple(tensors)


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    if dtype == torch.bool:
        return torch.rand(shape, generator=generator) < 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=generator).to(dtype)
    return torch.randint(0, 10, shape, generator=generator, dtype=dtype)


def load(
    spec: str | None,
    shapes: Sequence[str] = (),
    dtypes: Sequence[str] = (),
    generator: torch.Generator | None = None,
) -> list[LoadedModel]:
    """Built-in examples (``spec`` None or an example's name), a ``.pt2`` file, or ``pkg.mod:attr``."""
    generator = generator or torch.Generator().manual_seed(0)
    if spec is None:
        return [_example(name, generator) for name in EXAMPLES]
    if spec in EXAMPLES:
        return [_example(spec, generator)]
    if ":" in spec and not Path(spec).exists():
        return [_from_import(spec, shapes, dtypes, generator)]
    if Path(spec).is_dir() and (Path(spec) / "config.json").exists():
        return [_from_hugging_face(Path(spec), generator)]
    return [_from_pt2(Path(spec), shapes, dtypes, generator)]


def _example(name: str, generator: torch.Generator) -> LoadedModel:
    example = EXAMPLES[name]
    return LoadedModel(name, example.build().eval(), example.inputs(generator), terms=example.terms)


EXAMPLE_SEQUENCE = 16


class _Encoder(torch.nn.Module):
    """An encoder's last hidden state for one unpadded sequence of token ids."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.model(input_ids=input_ids).last_hidden_state


def _from_hugging_face(directory: Path, generator: torch.Generator) -> LoadedModel:
    """A Hugging Face encoder directory (BERT and the like): ``transformers``' ``AutoModel``, its
    weights if the directory has them (random ones, seeded, otherwise), exported for sequences of
    any length up to its position table. Decoders go to ``export-llm``."""
    try:
        from transformers import AutoConfig, AutoModel
    except ImportError as error:
        raise LoadError("a Hugging Face model needs transformers: pip install 'openvino-backend[llm]'") from error
    from openvino_backend.llm.models import HF_WEIGHTS

    try:
        config = AutoConfig.from_pretrained(directory)
    except (ValueError, OSError, KeyError) as error:
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LoadError(f"{directory / 'config.json'}: transformers cannot read it ({first})") from error
    if getattr(config, "is_encoder_decoder", False):
        raise LoadError(f"{directory}: an encoder-decoder model ({config.model_type}): `lower` takes encoders")
    if any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in getattr(config, "architectures", None) or []):
        raise LoadError(f"{directory}: a decoder ({config.model_type}): export it with `export-llm`")
    try:
        if any((directory / name).exists() for name in HF_WEIGHTS):
            model = AutoModel.from_pretrained(directory, dtype=torch.float32, attn_implementation="eager")
        else:
            with torch.random.fork_rng():
                torch.manual_seed(0)
                model = AutoModel.from_config(config, attn_implementation="eager")
    except Exception as error:  # transformers' verdict on this family or config
        first = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LoadError(f"{directory}: transformers cannot build {config.model_type} ({first})") from error
    vocab = int(getattr(config, "vocab_size", 0) or 2)
    longest = int(getattr(config, "max_position_embeddings", 0) or 512)
    ids = torch.randint(0, vocab, (1, min(EXAMPLE_SEQUENCE, longest)), generator=generator)
    hidden = int(getattr(config, "hidden_size", 1) or 1)
    return LoadedModel(
        f"{config.model_type}-{directory.name}",
        _Encoder(model.to(torch.float32).eval()).eval(),
        (ids,),
        terms=hidden,
        dynamic=(DynamicDim(0, 1, 2, longest),),
    )


def _from_pt2(path: Path, shapes: Sequence[str], dtypes: Sequence[str], generator: torch.Generator) -> LoadedModel:
    if not path.exists():
        raise LoadError(f"{path}: no such file")
    if path.is_dir():
        raise LoadError(f"{path}: is a directory, expected a .pt2 file saved with torch.export.save")
    if not zipfile.is_zipfile(path):
        raise LoadError(f"{path}: not a .pt2 archive (torch.export.save writes a zip file)")
    try:
        exported = torch.export.load(str(path))
    except Exception as error:  # torch raises many types for a damaged archive
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise LoadError(f"{path}: could not load the exported program ({reason})") from error
    example = exported.example_inputs
    if example is not None and example[0] and not shapes:
        inputs = tuple(x for x in example[0] if isinstance(x, torch.Tensor))
    else:
        inputs = random_inputs(shapes, dtypes, generator)
    return LoadedModel(path.name, exported.module(), inputs, exported=exported)


def _from_import(spec: str, shapes: Sequence[str], dtypes: Sequence[str], generator: torch.Generator) -> LoadedModel:
    module_name, _, attr = spec.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except ImportError as error:
        raise LoadError(f"{spec}: cannot import {module_name} ({error})") from error
    except AttributeError:
        raise LoadError(f"{spec}: {module_name} has no attribute {attr!r}") from None
    built = target if isinstance(target, torch.nn.Module) else _call_factory(spec, target)
    inputs: tuple[torch.Tensor, ...] | None = None
    if isinstance(built, tuple) and len(built) == 2 and isinstance(built[0], torch.nn.Module):
        built, inputs = built[0], tuple(built[1])
    if not isinstance(built, torch.nn.Module):
        raise LoadError(f"{spec}: expected an nn.Module, a factory of one, or (module, inputs); got {type(built)}")
    if inputs is None and not shapes:
        example = getattr(built, "example_inputs", None)
        inputs = tuple(example() if callable(example) else example) if example is not None else None
    if inputs is None or shapes:
        inputs = random_inputs(shapes, dtypes, generator)
    return LoadedModel(spec, built.eval(), inputs)


def _call_factory(spec: str, factory: object) -> object:
    if not callable(factory):
        raise LoadError(f"{spec}: is neither an nn.Module nor callable")
    try:
        return factory()
    except TypeError as error:
        raise LoadError(f"{spec}: calling it with no arguments failed ({error})") from error


@dataclass(frozen=True)
class DynamicDim:
    """``--dynamic IN.DIM=MIN:MAX``: dim DIM of input IN takes any size in MIN..MAX."""

    input: int
    dim: int
    low: int
    high: int

    @classmethod
    def parse(cls, text: str) -> DynamicDim:
        match = re.fullmatch(r"\s*(\d+)\.(\d+)\s*=\s*(\d+)\s*:\s*(\d+)\s*", text)
        if match is None:
            raise LoadError(f"--dynamic {text!r}: expected INPUT.DIM=MIN:MAX, e.g. 0.0=1:8 (input 0, dim 0)")
        index, dim, low, high = map(int, match.groups())
        if low > high:
            raise LoadError(f"--dynamic {text!r}: MIN is larger than MAX")
        return cls(index, dim, low, high)


def dynamic_shapes(dims: Sequence[DynamicDim], inputs: Sequence[torch.Tensor]) -> tuple[dict, ...] | None:
    """``dynamic_shapes`` for ``torch.export.export``; None when no dim is dynamic."""
    if not dims:
        return None
    spec: list[dict] = [{} for _ in inputs]
    for d in dims:
        if d.input >= len(inputs) or d.dim >= inputs[d.input].dim():
            raise LoadError(f"--dynamic {d.input}.{d.dim}: the model has no input {d.input} with a dim {d.dim}")
        if not d.low <= inputs[d.input].shape[d.dim] <= d.high:
            raise LoadError(
                f"--dynamic {d.input}.{d.dim}={d.low}:{d.high}: the example size "
                f"{inputs[d.input].shape[d.dim]} is outside the range"
            )
        spec[d.input][d.dim] = torch.export.Dim(f"in{d.input}_dim{d.dim}", min=d.low, max=d.high)
    return tuple(spec)


def dims_of(exported: torch.export.ExportedProgram) -> list[DynamicDim]:
    """The dynamic dims a saved program was exported with, from its range constraints."""
    user_inputs = [
        n for n in exported.graph.find_nodes(op="placeholder") if n.name in exported.graph_signature.user_inputs
    ]
    found = []
    for index, node in enumerate(user_inputs):
        val = node.meta.get("val")
        for dim, size in enumerate(val.shape if isinstance(val, torch.Tensor) else ()):
            if isinstance(size, int) or size.node.expr not in exported.range_constraints:
                continue
            bounds = exported.range_constraints[size.node.expr]
            high = int(bounds.upper) if bounds.upper.is_finite else int(size.node.hint or bounds.lower) * 2
            found.append(DynamicDim(index, dim, int(bounds.lower), high))
    return found


def sizes_to_run(dims: Sequence[DynamicDim], sizes: Sequence[int] | None) -> list[dict[tuple[int, int], int] | None]:
    """What each run sets the dynamic dims to: ``sizes`` for all of them, else low end, example (None), high end."""
    if not dims:
        return [None]
    if sizes:
        for d in dims:
            if any(not d.low <= s <= d.high for s in sizes):
                raise LoadError(f"--sizes {list(sizes)}: outside the range {d.low}..{d.high} of input {d.input}")
        return [{(d.input, d.dim): s for d in dims} for s in sizes]
    return [{(d.input, d.dim): d.low for d in dims}, None, {(d.input, d.dim): d.high for d in dims}]


def shapes_at(inputs: Sequence[torch.Tensor], sizes: dict[tuple[int, int], int] | None) -> list[tuple[int, ...]]:
    """The inputs' shapes with the dynamic dims set to ``sizes`` (None: the example's)."""
    return [
        tuple(sizes.get((index, dim), n) if sizes else n for dim, n in enumerate(x.shape))
        for index, x in enumerate(inputs)
    ]
