"""``python -m openvino_backend``: verify, lower and probe from the command line.

Exit codes: 0 success (all outputs match / no bug), 1 mismatch (or, for
``probe``, the OpenVINO bug is present), 2 export refused, 3 bad usage or an
unreadable model.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
import traceback
import warnings
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import NoReturn, TextIO

import torch
from executorch.exir.backend.compile_spec_schema import CompileSpec
from tabulate import tabulate

from openvino_backend.compile_spec import PRECISION_KEY
from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.loader import (
    DynamicDim,
    LoadedModel,
    LoadError,
    dims_of,
    dynamic_shapes,
    load,
    shapes_at,
    sizes_to_run,
)
from openvino_backend.partitioner import OpenvinoPartitioner, PartitionReport
from openvino_backend.precision import (
    PRECISIONS,
    effective_dtype,
    inference_precision,
    openvino_version,
    unit_roundoff,
)
from openvino_backend.probe import probe
from openvino_backend.quantize import quantize_int8
from openvino_backend.quiet import stderr
from openvino_backend.verify import OutputCheck, check_run, declared_formats, lower_exported, resample

EXIT_OK, EXIT_MISMATCH, EXIT_REFUSED, EXIT_USAGE = 0, 1, 2, 3
CALIBRATION_DRAWS = 8


class UsageError(Exception):
    pass


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # argparse would exit 2, which means "export refused" here
        self.print_usage(stderr())
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message}\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="openvino-backend", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def model_options(sub: argparse.ArgumentParser, *, required: bool) -> None:
        sub.add_argument(
            "model",
            nargs=None if required else "?",
            help="a .pt2 file (torch.export.save), pkg.module:attr (an nn.Module, a factory, or "
            "(module, inputs)), or a built-in example name; default: every built-in example",
        )
        sub.add_argument("--input-shape", action="append", default=[], metavar="D0,D1,..", help="once per input")
        sub.add_argument("--dtype", action="append", default=[], help="once, or once per --input-shape")
        sub.add_argument("--device", default="CPU", help="OpenVINO device (default CPU)")
        sub.add_argument(
            "--dynamic",
            action="append",
            default=[],
            metavar="IN.DIM=MIN:MAX",
            help="export dim DIM of input IN as dynamic in MIN..MAX (repeatable); a .pt2 keeps its own",
        )
        sub.add_argument(
            "--no-conversion-check",
            action="store_true",
            help="skip converting proposed partitions while partitioning (faster; the copy list and the "
            "export-time checks still apply, so what they miss is refused instead of kept out)",
        )
        sub.add_argument(
            "--int8",
            action="store_true",
            help="quantize first (PT2E with ExecuTorch's XNNPACKQuantizer: int8 weights per channel, "
            "activations per tensor; calibrated on random draws); verify then compares with the "
            "quantized eager model and reports the float model's error beside it",
        )
        sub.add_argument(
            "--precision",
            choices=PRECISIONS,
            help="the precision the target CPU computes float32 in (bf16 with AMX or AVX512-BF16, f32 "
            "without): the numerical check compiles for it and judges by it; default: this machine's",
        )
        sub.add_argument("--debug", action="store_true", help="tracebacks and library logs")

    verify = commands.add_parser("verify", help="lower, run on the ExecuTorch runtime, compare with eager")
    model_options(verify, required=False)
    verify.add_argument("--draws", type=int, default=3, help="random input draws to run (default 3)")
    verify.add_argument("--seed", type=int, default=0)
    verify.add_argument(
        "--sizes",
        metavar="N,N,..",
        help="with dynamic dims: the sizes to run at, for every dynamic dim (default: the low end, "
        "the example's size and the high end)",
    )
    verify.add_argument("--json", action="store_true", help="print one JSON document instead of text")
    verify.add_argument("--output", type=Path, metavar="FILE.pte", help="also write the lowered program")

    lower = commands.add_parser("lower", help="lower a model and write the .pte")
    model_options(lower, required=True)
    lower.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.pte")

    probe_cmd = commands.add_parser("probe", help="does the installed OpenVINO return stale outputs? (no ExecuTorch)")
    probe_cmd.add_argument("--device", default="CPU")
    probe_cmd.add_argument("--json", action="store_true")
    probe_cmd.add_argument("--debug", action="store_true")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _quiet_libraries(args.debug)
    try:
        if args.command == "probe":
            return _probe(args)
        if args.command == "lower":
            return _lower(args)
        return _verify(args)
    except (LoadError, UsageError) as error:
        if args.debug:
            traceback.print_exc()
        print(f"error: {error}", file=stderr())
        return EXIT_USAGE


def _quiet_libraries(debug: bool) -> None:
    logging.basicConfig(level=logging.INFO if debug else logging.ERROR, format="%(levelname)s %(name)s: %(message)s")
    if not debug:
        warnings.filterwarnings("ignore")


@dataclass
class ModelResult:
    """Everything ``verify`` learned about one model."""

    name: str
    report: PartitionReport | None = None
    refused: str | None = None
    refused_kind: str | None = None
    outputs: list[OutputCheck] = field(default_factory=list)
    run_error: str | None = None
    modified_inputs: list[int] = field(default_factory=list)
    draws: int = 0
    sizes: int = 1  # input sizes each draw ran at (dynamic dims)

    @property
    def exit_code(self) -> int:
        if self.refused is not None:
            return EXIT_REFUSED
        ok = self.run_error is None and not self.modified_inputs and all(o.ok for o in self.outputs)
        return EXIT_OK if ok else EXIT_MISMATCH


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
    return [DynamicDim.parse(text) for text in args.dynamic]


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


def _verify(args: argparse.Namespace) -> int:
    if args.draws < 1:
        raise UsageError("--draws must be at least 1")
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
        json.dump(_verify_json(results, args.device), sys.stdout, indent=2)
        print()
    else:
        for result in results:
            _print_result(result, args.device, sys.stdout)
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


def _parse_sizes(text: str | None) -> list[int] | None:
    if text is None:
        return None
    try:
        sizes = [int(part) for part in text.split(",") if part.strip()]
    except ValueError:
        raise UsageError(f"--sizes {text!r}: expected comma-separated integers") from None
    if not sizes:
        raise UsageError(f"--sizes {text!r}: give at least one size")
    return sizes


def _numbered(path: Path, name: str) -> Path:
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in name)
    return path.with_name(f"{path.stem}-{safe}{path.suffix}")


def _write(path: Path, buffer: bytes) -> None:
    try:
        path.write_bytes(buffer)
    except OSError as error:
        raise UsageError(f"cannot write {path}: {error.strerror}") from error


def _precision_line(device: str, checked: str | None) -> str:
    computed = effective_dtype(torch.float32, device)
    u = unit_roundoff(computed)
    name = str(computed).removeprefix("torch.")
    how = "INFERENCE_PRECISION_HINT default" if computed != torch.float32 else "as the model"
    target = f"; export checked for a target computing in {checked}" if checked is not None else ""
    return (
        f"{device} computes float32 in {name} ({how}){target}; tolerance per output: "
        f"atol = 4·u·√terms·max(|expected|, 1), rtol = 4·u, u = {u:.2g}; integers and bools exactly; "
        "quantized outputs within one quantization step"
    )


def _print_result(result: ModelResult, device: str, out: TextIO) -> None:
    print(f"model: {result.name}", file=out)
    if result.refused is not None:
        print("  export refused:", file=out)
        print("    " + result.refused.replace("\n", "\n    "), file=out)
        return
    _print_partitions(result.report, out)
    print("  validation: passed (no partition output is fed by a partition input, converted and compiled)", file=out)
    checked = result.report.precision if result.report is not None else None
    print(f"  precision: {_precision_line(device, checked)}", file=out)
    if result.run_error is not None:
        print(f"  run failed: {result.run_error}", file=out)
    else:
        quantized = any(o.float_error is not None for o in result.outputs)
        rows = [
            (
                o.index,
                "x".join(map(str, o.shape)) or "scalar",
                str(o.dtype).removeprefix("torch."),
                f"{o.max_abs:.3g}",
                f"{o.max_rel:.3g}",
                f"{o.tolerance.atol:.2g} / {o.tolerance.rtol:.2g}",
                _verdict(o),
                *([f"{o.float_error:.3g}"] if quantized else []),
            )
            for o in result.outputs
        ]
        headers = ("output", "shape", "dtype", "max abs err", "max rel err", "atol / rtol", "verdict")
        if quantized:
            headers = (*headers, "max abs err vs float model")
        at = f" at {result.sizes} input sizes each" if result.sizes > 1 else ""
        against = "the quantized eager model (INT8; atol includes 2x its quantization noise)" if quantized else "eager"
        print(f"  runs: {result.draws} input draws{at} on executorch.runtime vs {against}", file=out)
        print("    " + tabulate(rows, headers=headers).replace("\n", "\n    "), file=out)
    if result.modified_inputs:
        print(f"  inputs modified by the program: {result.modified_inputs}", file=out)
    quantized = any(o.float_error is not None for o in result.outputs)
    matched = "all outputs match the quantized eager model" if quantized else "all outputs match eager"
    verdict = {EXIT_OK: matched, EXIT_MISMATCH: "MISMATCH"}[result.exit_code]
    print(f"  verdict: {verdict}\n", file=out)


def _print_partitions(report: PartitionReport | None, out: TextIO) -> None:
    if report is None:
        return
    print(
        f"  partitions: {report.partitions}, {report.delegated_nodes} of {report.total_nodes} ops delegated "
        f"to OpenVINO ({report.delegated_share:.0%})",
        file=out,
    )
    if report.kept_out:
        print(f"  kept out of OpenVINO ({len(report.kept_out)}):", file=out)
        for node, reason in report.kept_out:
            where = f"  {node.source}  {node.source.code}" if node.source else ""
            print(f"    {node.name} ({node.op}){where}\n      {reason}", file=out)


def _verdict(output: OutputCheck) -> str:
    if not output.values_ok:
        return "MISMATCH"
    return "match" if output.layout_ok else "MISMATCH (memory format)"


def _verify_json(results: list[ModelResult], device: str) -> dict[str, object]:
    computed = effective_dtype(torch.float32, device)
    return {
        "openvino_version": openvino_version(),
        "device": device,
        "inference_precision": str(inference_precision(device)).removeprefix("torch."),
        "float32_computed_as": str(computed).removeprefix("torch."),
        "exit_code": max(r.exit_code for r in results),
        "models": [_model_json(r) for r in results],
    }


def _model_json(result: ModelResult) -> dict[str, object]:
    report = result.report
    return {
        "name": result.name,
        "exit_code": result.exit_code,
        "refused": None if result.refused is None else {"error": result.refused_kind, "message": result.refused},
        "partitions": None
        if report is None
        else {
            "count": report.partitions,
            "checked_precision": report.precision,
            "delegated_nodes": report.delegated_nodes,
            "total_nodes": report.total_nodes,
            "delegated_share": report.delegated_share,
            "kept_out": [
                {"node": n.name, "op": n.op, "source": str(n.source) if n.source else None, "reason": why}
                for n, why in report.kept_out
            ],
        },
        "draws": result.draws,
        "sizes_per_draw": result.sizes,
        "run_error": result.run_error,
        "modified_inputs": result.modified_inputs,
        "outputs": [
            {
                "index": o.index,
                "shape": list(o.shape),
                "dtype": str(o.dtype).removeprefix("torch."),
                "max_abs_error": o.max_abs,
                "max_rel_error": o.max_rel,
                "atol": o.tolerance.atol,
                "rtol": o.tolerance.rtol,
                "verdict": "match" if o.ok else "mismatch",
                "max_abs_error_vs_float_model": o.float_error,
            }
            for o in result.outputs
        ],
    }


def _lower(args: argparse.Namespace) -> int:
    models = load(args.model, args.input_shape, args.dtype)
    result, buffer, _, _ = _lower_one(models[0], args)
    if buffer is None:
        print(f"model: {result.name}\n  export refused:\n    " + str(result.refused).replace("\n", "\n    "))
        return EXIT_REFUSED
    _write(args.output, buffer)
    print(f"model: {result.name}")
    _print_partitions(result.report, sys.stdout)
    print(f"  wrote {args.output} ({len(buffer):,} bytes)")
    return EXIT_OK


def _probe(args: argparse.Namespace) -> int:
    found = probe(args.device)
    if args.json:
        print(json.dumps(found.as_dict(), indent=2))
    else:
        print(f"OpenVINO {found.openvino_version} on {found.device}, a Result fed by its Parameter beside sin(x):")
        print(f"  inputs bound first:  output stale: {_yes(found.stale_output)}, ", end="")
        print(f"input overwritten: {_yes(found.input_overwritten)}")
        print(f"  outputs bound first: correct: {_yes(found.outputs_first_ok)}")
        if found.bug_present:
            print("verdict: bug PRESENT: keep the partitioner's copy rule and the export-time validator")
        else:
            print("verdict: bug absent in this OpenVINO: the copy rule could be reconsidered")
    return EXIT_MISMATCH if found.bug_present else EXIT_OK


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


if __name__ == "__main__":
    sys.exit(main())
