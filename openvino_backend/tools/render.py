"""How ``verify``, ``lower`` and ``probe`` show what they found: text tables and JSON."""

from __future__ import annotations

from typing import TextIO

import torch
from tabulate import tabulate

from openvino_backend.partition.partitioner import PartitionReport
from openvino_backend.runtime import effective_dtype, inference_precision, openvino_version, unit_roundoff
from openvino_backend.tools.results import EXIT_MISMATCH, EXIT_OK, ModelResult
from openvino_backend.tools.verify import OutputCheck


def precision_line(device: str, checked: str | None) -> str:
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


def print_result(result: ModelResult, device: str, out: TextIO) -> None:
    print(f"model: {result.name}", file=out)
    if result.refused is not None:
        print("  export refused:", file=out)
        print("    " + result.refused.replace("\n", "\n    "), file=out)
        return
    print_partitions(result.report, out)
    print("  validation: passed (no partition output is fed by a partition input, converted and compiled)", file=out)
    checked = result.report.precision if result.report is not None else None
    print(f"  precision: {precision_line(device, checked)}", file=out)
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
                output_verdict(o),
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


def print_partitions(report: PartitionReport | None, out: TextIO) -> None:
    if report is None:
        return
    print(
        f"  partitions: {report.partitions}, {report.delegated_nodes} of {report.total_nodes} ops delegated "
        f"to OpenVINO ({report.delegated_share:.0%})",
        file=out,
    )
    if report.kept_out:
        print(f"  kept out of OpenVINO ({len(report.kept_out)}):", file=out)
        for node, rule, reason in report.kept_out:
            where = f"  {node.source}  {node.source.code}" if node.source else ""
            print(f"    {node.name} ({node.op}){where}\n      {reason} [{rule}]", file=out)


def output_verdict(output: OutputCheck) -> str:
    if not output.values_ok:
        return "MISMATCH"
    return "match" if output.layout_ok else "MISMATCH (memory format)"


def verify_json(results: list[ModelResult], device: str) -> dict[str, object]:
    computed = effective_dtype(torch.float32, device)
    return {
        "openvino_version": openvino_version(),
        "device": device,
        "inference_precision": str(inference_precision(device)).removeprefix("torch."),
        "float32_computed_as": str(computed).removeprefix("torch."),
        "exit_code": max(r.exit_code for r in results),
        "models": [model_json(r) for r in results],
    }


def model_json(result: ModelResult) -> dict[str, object]:
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
                {"node": n.name, "op": n.op, "source": str(n.source) if n.source else None, "rule": rule, "reason": why}
                for n, rule, why in report.kept_out
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


def yes(flag: bool) -> str:
    return "yes" if flag else "no"
