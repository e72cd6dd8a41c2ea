"""The commands: lower a model (quantized first with ``--int8``), run it, compare it with eager."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import traceback
from pathlib import Path

import torch
from executorch.exir import ExecutorchProgramManager
from executorch.exir.backend.compile_spec_schema import CompileSpec

from openvino_backend.compile_spec import PRECISION_KEY
from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.partition.partitioner import OpenvinoPartitioner
from openvino_backend.program import write_program
from openvino_backend.tools import render
from openvino_backend.tools.loader import (
    DynamicDim,
    LoadedModel,
    dims_of,
    dynamic_shapes,
    load,
    shapes_at,
    sizes_to_run,
)
from openvino_backend.tools.probe import probe
from openvino_backend.tools.quantize import quantize_int8
from openvino_backend.tools.quiet import stderr
from openvino_backend.tools.results import EXIT_MISMATCH, EXIT_OK, EXIT_REFUSED, ModelResult, UsageError
from openvino_backend.tools.verify import OutputCheck, check_run, declared_formats, lower_exported, resample

CALIBRATION_DRAWS = 8


def _partitioner(args: argparse.Namespace) -> OpenvinoPartitioner:
    specs = [CompileSpec("device", args.device.encode())]
    if args.precision is not None:
        specs.append(CompileSpec(PRECISION_KEY, args.precision.encode()))
    return OpenvinoPartitioner(specs, check_by_conversion=not args.no_conversion_check)


def _dynamic_dims(model: LoadedModel, args: argparse.Namespace) -> list[DynamicDim]:
    if model.exported is not None:
        if args.dynamic:
            raise UsageError("--dynamic: a .pt2 program keeps the dynamic dims it was exported with")
        return dims_of(model.exported)
    return [DynamicDim.parse(text) for text in args.dynamic] or list(model.dynamic)


def _lower_one(
    model: LoadedModel, args: argparse.Namespace
) -> tuple[ModelResult, bytes | None, object, torch.nn.Module]:
    """The lowering's result, its program (None if refused) and the eager model to compare it with."""
    result = ModelResult(model.name)
    partitioner = _partitioner(args)
    # Dims that do not fit the model are a usage error, not a refused export: checked before exporting.
    shapes = dynamic_shapes(_dynamic_dims(model, args), model.inputs)
    reference = model.module
    try:
        exported = model.exported
        if args.int8:
            generator = torch.Generator().manual_seed(getattr(args, "seed", 0))  # `lower` has no --seed
            calibration = [resample(model.inputs, generator) for _ in range(CALIBRATION_DRAWS)]
            reference = quantize_int8(exported or model.module, model.inputs, calibration)
            exported = torch.export.export(reference, tuple(model.inputs), dynamic_shapes=shapes)
        exported = exported or torch.export.export(model.module, model.inputs, dynamic_shapes=shapes)
        program = lower_exported(exported, partitioner=partitioner)
    except OpenvinoExportError as error:
        result.refused, result.refused_kind = str(error), type(error).__name__
        return result, None, None, reference
    except Exception as error:  # torch.export / to_edge failures: still "export refused"
        if args.debug:
            traceback.print_exc()
        result.refused = f"{type(error).__name__}: {error}"
        result.refused_kind = type(error).__name__
        return result, None, None, reference
    result.report = partitioner.report
    return result, program.buffer, program, reference


def verify(args: argparse.Namespace) -> int:
    if args.draws < 1:
        raise UsageError("--draws must be at least 1")
    check_output(args.output)
    generator = torch.Generator().manual_seed(args.seed)
    models = load(args.model, args.input_shape, args.dtype, generator)
    results = []
    for model in models:
        result, buffer, program, reference = _lower_one(model, args)
        if buffer is not None:
            if args.output is not None:
                _write(args.output if len(models) == 1 else _numbered(args.output, model.name), buffer)
            _run_draws(result, model, reference, buffer, declared_formats(program), args, generator)
        results.append(result)
    if args.json:
        json.dump(render.verify_json(results, args.device), sys.stdout, indent=2)
        print()
    else:
        for result in results:
            render.print_result(result, args.device, sys.stdout)
    return max(r.exit_code for r in results)


def _run_draws(
    result: ModelResult, model: LoadedModel, reference: torch.nn.Module, buffer: bytes, formats, args, generator
) -> None:
    """``--draws`` input draws at each size to run at; the worst error per output and shape."""
    runs = sizes_to_run(_dynamic_dims(model, args), _parse_sizes(args.sizes))
    worst: dict[tuple[int, tuple[int, ...]], OutputCheck] = {}
    progress = stderr().isatty() and not args.json
    for draw in range(args.draws):
        if progress:
            print(f"\r{model.name}: run {draw + 1}/{args.draws}", end="", file=stderr(), flush=True)
        for sizes in runs:
            shapes = shapes_at(model.inputs, sizes)
            inputs = list(model.inputs) if draw == 0 and sizes is None else resample(model.inputs, generator, shapes)
            float_module = model.module if reference is not model.module else None
            check = check_run(
                reference,
                buffer,
                inputs,
                device=args.device,
                terms=model.terms,
                formats=formats,
                float_module=float_module,
            )
            if check.error is not None:
                result.run_error = check.error
                break
            result.modified_inputs = sorted(set(result.modified_inputs) | set(check.modified_inputs))
            for out in check.outputs:
                previous = worst.get((out.index, out.shape))
                if previous is None or not out.ok or (previous.ok and out.max_abs > previous.max_abs):
                    worst[(out.index, out.shape)] = out
        result.draws += 1
        if result.run_error is not None:
            break
    if progress:
        print("\r\033[K", end="", file=stderr(), flush=True)
    result.sizes = len(runs)
    result.outputs = [worst[key] for key in sorted(worst)]


def _parse_sizes(text: str | None, option: str = "--sizes") -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"{option} {text!r}: expected comma-separated integers") from None
    if not sizes:
        raise UsageError(f"{option} {text!r}: give at least one")
    return sizes


def _numbered(path: Path, name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def check_output(path: Path | None) -> None:
    """Refuse an output path that cannot be written, before any work: exporting can take minutes."""
    if path is None:
        return
    parent = path.resolve().parent
    if path.is_dir():
        raise UsageError(f"-o {path}: a directory; give the file to write")
    if not parent.is_dir():
        raise UsageError(f"-o {path}: the directory {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise UsageError(f"-o {path}: cannot write into {parent}")


def _write(path: Path, buffer: bytes | ExecutorchProgramManager) -> int:
    """Write ``buffer`` (a program is written segment by segment: an LLM's is gigabytes); its size."""
    try:
        if path.suffix == ".pte" or not isinstance(buffer, bytes):
            return write_program(buffer, path)  # refuses a program the installed OpenVINO cannot run
        path.write_bytes(buffer)
        return len(buffer)
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from error


def lower(args: argparse.Namespace) -> int:
    check_output(args.output)
    models = load(args.model, args.input_shape, args.dtype)
    result, buffer, _, _ = _lower_one(models[0], args)
    if buffer is None:
        print(f"model: {result.name}\n  export refused:\n    " + str(result.refused).replace("\n", "\n    "))
        return EXIT_REFUSED
    _write(args.output, buffer)
    print(f"model: {result.name}")
    render.print_partitions(result.report, sys.stdout)
    print(f"  wrote {args.output} ({len(buffer):,} bytes)")
    return EXIT_OK


def probe_command(args: argparse.Namespace) -> int:
    found = probe(args.device)
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
    else:
        print(f"OpenVINO {found.openvino_version} on {found.device}, a Result fed by its Parameter beside sin(x):")
        print(f"  inputs bound first:  output stale: {render.yes(found.stale_output)}, ", end="")
        print(f"input overwritten: {render.yes(found.input_overwritten)}")
        print(f"  outputs bound first: correct: {render.yes(found.outputs_first_ok)}")
        if found.bug_present:
            print("verdict: bug PRESENT: keep the partitioner's copy rule and the export-time validator")
        else:
            print("verdict: bug absent in this OpenVINO: the copy rule could be reconsidered")
    return EXIT_MISMATCH if found.bug_present else EXIT_OK


def export_llm(args: argparse.Namespace) -> int:
    from openvino_backend.llm.export import INT4_GROUP, CompressionError, export_decoder
    from openvino_backend.llm.models import ModelSourceError, load_decoder
    from openvino_backend.tools.quiet import nncf_off_stdout

    check_output(args.output)
    weights = {"8w": "int8", "4w": "int4"}.get(args.qlinear, args.weights)
    if args.qlinear is not None and args.weights not in ("f32", weights):
        raise UsageError(f"--qlinear {args.qlinear} and --weights {args.weights} disagree")
    if args.sym and weights == "f32":
        raise UsageError("--sym shapes compressed weights: give --weights int8 or int4 with it")
    four_bit_only = {
        "--ratio": args.ratio is not None,
        "--group-size": args.group_size is not None,
        "--calibration-prompt": bool(args.calibration_prompt),
    }
    if weights != "int4" and (given := [flag for flag, present in four_bit_only.items() if present]):
        raise UsageError(f"{' and '.join(given)} only shape 4-bit weights: give --weights int4 with them")
    ratio = 1.0 if args.ratio is None else args.ratio
    group_size = INT4_GROUP if args.group_size is None else args.group_size
    try:
        # Compressed without calibration, the weights are read from the checkpoint as they are compressed.
        streamed = weights != "f32" and not args.calibration_prompt
        decoder = load_decoder(
            args.model, checkpoint=args.checkpoint, max_context=args.max_seq_len, stored_weights=streamed
        )
    except ModelSourceError as error:
        raise UsageError(str(error)) from error
    calibration = []
    if args.calibration_prompt:
        if decoder.tokenizer is None:
            raise UsageError("--calibration-prompt needs the model's tokenizer (tokenizer.json or tokenizer.model)")
        from pytorch_tokenizers import get_tokenizer

        tokenizer = get_tokenizer(str(decoder.tokenizer))
        calibration = [list(tokenizer.encode(text, bos=True, eos=False)) for text in args.calibration_prompt]
    try:
        with contextlib.nullcontext() if args.debug else nncf_off_stdout():
            program = export_decoder(
                decoder,
                dynamic=not args.disable_dynamic_shapes,
                weights=weights,
                calibration=calibration,
                ratio=ratio,
                group_size=group_size,
                symmetric=args.sym,
            )
    except CompressionError as error:
        raise UsageError(str(error)) from error
    except OpenvinoExportError as error:
        print(f"model: {decoder.name}\n  export refused:\n    " + str(error).replace("\n", "\n    "))
        return EXIT_REFUSED
    size = _write(args.output, program)
    if weights == "int4":
        weights += f", groups of {group_size}"
        if ratio < 1:
            weights += f", {ratio:.0%} of the layers, the rest int8"
    if args.sym and "int8" in weights:
        weights += " symmetric"
    print(f"model: {decoder.name} (vocabulary {decoder.vocab_size}, context {decoder.max_context}, weights {weights})")
    print(f"  wrote {args.output} ({size:,} bytes)")
    if decoder.tokenizer is not None:
        beside = tokenizer_beside(args.output, decoder.tokenizer.suffix)
        _write(beside, decoder.tokenizer.read_bytes())
        print(f"  tokenizer: {beside}")
    return EXIT_OK


def tokenizer_beside(program: Path, suffix: str) -> Path:
    return program.with_name(f"{program.stem}.tokenizer{suffix}")


def generate(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1:
        raise UsageError("--max-new-tokens must be at least 1")
    if args.prompt is not None and not args.prompt.strip():
        raise UsageError("--prompt is empty: give the text to continue")
    path = args.tokenizer or next(
        (p for p in (tokenizer_beside(args.program, s) for s in (".json", ".model")) if p.exists()), None
    )
    if args.tokenizer is not None and not args.tokenizer.is_file():
        raise UsageError(f"--tokenizer {args.tokenizer}: no such file")
    tokenizer = _tokenizer(path) if path is not None else None
    if args.prompt is not None:
        if tokenizer is None:
            raise UsageError("--prompt needs a tokenizer (--tokenizer), or give --prompt-ids")
        ids = list(tokenizer.encode(args.prompt, bos=True, eos=False))
    else:
        ids = _parse_sizes(args.prompt_ids, "--prompt-ids")
    generator = _generator(args.program)
    outside = [i for i in ids if not 0 <= i < generator.vocab_size]
    if outside:
        raise UsageError(f"token ids {outside[:5]} are outside the program's vocabulary of {generator.vocab_size}")
    context = generator.max_context
    if context and len(ids) >= context:
        raise UsageError(
            f"the prompt is {len(ids)} tokens and the program's context {context}: give at most {context - 1} "
            "(or export with a longer --max-seq-len)"
        )
    # The first new token comes from the prompt's logits; each further one takes a position.
    if context and len(ids) + args.max_new_tokens - 1 > context:
        print(
            f"note: the context ({context}) leaves room for {context - len(ids) + 1} new tokens after this prompt, "
            f"not the {args.max_new_tokens} asked for",
            file=stderr(),
        )
    if args.runner == "executorch":
        del generator  # the C++ runner loads the program itself
        return _generate_with_executorch_runner(args, path)
    run = generator.generate(ids, args.max_new_tokens)
    text = tokenizer.decode(run.tokens) if tokenizer is not None else " ".join(map(str, run.tokens))
    print(text)
    print(
        f"[{len(run.prompt)} prompt tokens in {run.prefill_ms:.1f} ms; {len(run.tokens)} new tokens, "
        f"{run.ms_per_token:.2f} ms per token; stopped at {run.stopped}]",
        file=stderr(),
    )
    return EXIT_OK


def _tokenizer(path: Path) -> object:
    from pytorch_tokenizers import get_tokenizer

    try:
        return get_tokenizer(str(path))
    except Exception as error:  # pytorch_tokenizers raises whatever its parser raised
        raise UsageError(f"cannot read the tokenizer {path}: {type(error).__name__}: {error}") from error


def _generator(program: Path) -> object:
    """The program loaded from its file, or a usage error that says why it cannot be."""
    from openvino_backend.llm.generate import Generator
    from openvino_backend.program import ProgramLayoutError

    if not program.is_file():
        raise UsageError(f"{program}: no such file")
    try:
        return Generator(program)  # from its path, memory-mapped, as deployments load it
    except ProgramLayoutError as error:
        raise UsageError(str(error).splitlines()[0] + ": " + error.fix.replace("\n", " ")) from error
    except ValueError as error:  # not an ExecuTorch program at all
        raise UsageError(f"{program}: {error}") from error
    except RuntimeError as error:  # the runtime's verdict: truncated, or a delegate (OpenVINO) that fails to load
        raise UsageError(
            f"{program}: ExecuTorch's runtime cannot load it ({str(error).strip().splitlines()[0]}): "
            "a truncated or damaged file, or one written for another runtime"
        ) from error


def _generate_with_executorch_runner(args: argparse.Namespace, tokenizer: Path | None) -> int:
    from openvino_backend.llm.runner import ExecutorchRunner, PartialCharacterError

    if args.prompt is None:
        raise UsageError("--runner executorch takes a text --prompt (ExecuTorch's runner encodes it itself)")
    if tokenizer is None:
        raise UsageError("--runner executorch needs the model's tokenizer (--tokenizer)")
    try:
        run = ExecutorchRunner(args.program, tokenizer).generate(args.prompt, args.max_new_tokens)
    except PartialCharacterError as error:  # only on a Python whose strict decoding cannot be hooked
        raise UsageError(f"{error}: use --runner python") from error
    print(run.text)
    print(
        f"[ExecuTorch TextLLMRunner: {run.prompt_tokens} prompt tokens in {run.prefill_ms:.0f} ms; "
        f"{len(run.pieces)} new tokens, {run.ms_per_token:.2f} ms per token]",
        file=stderr(),
    )
    return EXIT_OK
