"""One lowering backend in its own process: ours, or ExecuTorch 1.5.1's.

They never share a process (both define a BackendDetails named
OpenvinoBackend). Protocol: one JSON request per stdin line
({"model": name, "out": path}), one JSON response per line on the original
stdout; everything the libraries print goes to stderr.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
import time
import warnings

from bench import answer_stream


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", choices=("ours", "ours-no-check", "upstream"), required=True)
    args = parser.parse_args()
    out = answer_stream()
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)

    import torch
    from executorch.exir import to_edge_transform_and_lower
    from executorch.exir.backend.compile_spec_schema import CompileSpec

    from bench.models import MODELS, inputs_for

    recording = contextlib.nullcontext
    from openvino_backend.program import to_executorch  # defines no backend: how either one's program is written

    if args.backend.startswith("ours"):
        import functools

        from openvino_backend.partition.partitioner import OpenvinoPartitioner
        from openvino_backend.timing import recording  # the package's own stages, timed where they run

        if args.backend == "ours-no-check":  # what conversion-aware partitioning costs
            OpenvinoPartitioner = functools.partial(OpenvinoPartitioner, check_by_conversion=False)
    else:
        from executorch.backends.openvino import OpenvinoPartitioner
    print(json.dumps({"ready": True}), file=out)

    for line in sys.stdin:
        request = json.loads(line)
        model = MODELS[request["model"]].build()
        inputs = inputs_for(request["model"])
        try:
            exported = torch.export.export(model, inputs)
            start = time.perf_counter()
            with recording() as steps:
                program = to_executorch(
                    to_edge_transform_and_lower(
                        exported, partitioner=[OpenvinoPartitioner([CompileSpec("device", b"CPU")])]
                    )
                )
            seconds = time.perf_counter() - start
        except Exception as error:
            print(json.dumps({"error": f"{type(error).__name__}: {str(error).splitlines()[0]}"}), file=out)
            continue
        with open(request["out"], "wb") as f:
            f.write(program.buffer)
        print(json.dumps({"seconds": seconds, "steps": dict(steps or {})}), file=out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
