"""One lowering backend in its own process: ours, or ExecuTorch 1.5.1's.

They never share a process (both define a BackendDetails named
OpenvinoBackend). Protocol: one JSON request per stdin line
({"model": name, "out": path}), one JSON response per line on the original
stdout; everything the libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import inspect
import json
import logging
import os
import sys
import time
import warnings
from collections import defaultdict


def _protocol_stream():
    stream = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # library prints (C and Python) go to stderr from here on
    sys.stdout = sys.stderr
    return stream


def _timed(totals: dict[str, float], name: str, fn):
    """``fn``, adding the seconds each call takes to ``totals[name]`` (for a generator, the
    seconds spent producing its items: the partitioner's rules are generators)."""
    if inspect.isgeneratorfunction(fn):

        def generator(*args, **kwargs):
            items = fn(*args, **kwargs)
            while True:
                start = time.perf_counter()
                try:
                    item = next(items)
                except StopIteration:
                    return
                finally:
                    totals[name] += time.perf_counter() - start
                yield item

        return generator

    def wrapper(*args, **kwargs):
        start = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            totals[name] += time.perf_counter() - start

    return wrapper


def _instrument_preprocess(totals: dict[str, float]) -> None:
    """Time each named step of our preprocess (the validation share)."""
    import openvino_backend.preprocess as pre

    steps = (
        "edge_dim_orders",
        "run_passes",
        "convert",
        "validate_model",
        "validate_output_types",
        "adapt_edge_layouts",
        "compile_model",
        "validate_compiled",
    )
    for name in steps:
        setattr(pre, name, _timed(totals, name, getattr(pre, name)))
    backend = pre.OpenvinoBackend
    original = backend.preprocess.__func__

    def preprocess(cls, *args, **kwargs):
        start = time.perf_counter()
        try:
            return original(cls, *args, **kwargs)
        finally:
            totals["preprocess"] += time.perf_counter() - start

    backend.preprocess = classmethod(preprocess)


def _instrument_partitioner(totals: dict[str, float]) -> None:
    """Time the partitioner's checks that convert and run partitions (their share of lowering)."""
    import openvino_backend.numerics as numerics
    import openvino_backend.partitioner as part

    partitioner = part.OpenvinoPartitioner
    partitioner.partition = _timed(totals, "partition", partitioner.partition)
    partitioner.transform_for_pre_decomposition = _timed(
        totals, "pre_decomposition", partitioner.transform_for_pre_decomposition
    )
    part.sample_values = _timed(totals, "numerical_check", part.sample_values)
    part.keep_converted_passthroughs_out = _timed(totals, "conversion_check", part.keep_converted_passthroughs_out)
    numerics.NumericalCheck.__call__ = _timed(totals, "numerical_check", numerics.NumericalCheck.__call__)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("ours", "ours-no-check", "upstream"), required=True)
    args = parser.parse_args()
    out = _protocol_stream()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)

    import torch
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from bench.models import MODELS, inputs_for

    steps: dict[str, float] = defaultdict(float)
    if args.backend.startswith("ours"):
        import functools

        from openvino_backend import OpenvinoPartitioner

        _instrument_preprocess(steps)
        _instrument_partitioner(steps)
        if args.backend == "ours-no-check":  # what conversion-aware partitioning costs
            OpenvinoPartitioner = functools.partial(OpenvinoPartitioner, check_by_conversion=False)
    else:
        from executorch.backends.openvino import OpenvinoPartitioner
    print(json.dumps({"ready": True}), file=out)

    for line in sys.stdin:
        request = json.loads(line)
        model = MODELS[request["model"]].build()
        inputs = inputs_for(request["model"])
        steps.clear()
        try:
            exported = torch.export.export(model, inputs)
            start = time.perf_counter()
            program = to_edge_transform_and_lower(
                exported, partitioner=[OpenvinoPartitioner([CompileSpec("device", b"CPU")])]
            ).to_executorch()
            seconds = time.perf_counter() - start
        except Exception as error:
            print(json.dumps({"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}), file=out)
            continue
        with open(request["out"], "wb") as f:
            f.write(program.buffer)
        print(json.dumps({"seconds": seconds, "steps": dict(steps)}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
