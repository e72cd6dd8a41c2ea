"""Turn what a user names on the command line into a module and example inputs."""

from __future__ import annotations

import importlib
import zipfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from openvino_backend.examples import EXAMPLES


class LoadError(Exception):
    """The model could not be loaded; the message says why, in one line."""


@dataclass
class LoadedModel:
    name: str
    module: torch.nn.Module
    inputs: tuple[torch.Tensor, ...]
    exported: torch.export.ExportedProgram | None = None
    terms: int = 1


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
    return [_from_pt2(Path(spec), shapes, dtypes, generator)]


def _example(name: str, generator: torch.Generator) -> LoadedModel:
    example = EXAMPLES[name]
    return LoadedModel(name, example.build().eval(), example.inputs(generator), terms=example.terms)


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
