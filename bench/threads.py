"""Decode speed from a plain Python process that imported PyTorch (``python -m bench --threads``).

Every row is a fresh process with the environment a user's script has (no
``OMP_WAIT_POLICY``; this file runs as a script, not through the ``bench``
package, which sets it), running the same exported decoder:

* ExecuTorch's ``Method.execute`` in a loop with a PyTorch argmax between
  calls: what a script using ExecuTorch's runtime directly does;
* this package's ``Generator``;
* ``Generator`` with ``OMP_WAIT_POLICY=PASSIVE`` set before PyTorch loads:
  PyTorch's workers never spin, the reference.

Rounds are interleaved; the figure is the median of each process's median
decode ms.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

PARAMS = {
    "dim": 512,
    "n_layers": 8,
    "n_heads": 8,
    "n_kv_heads": 2,
    "vocab_size": 32000,
    "multiple_of": 256,
    "norm_eps": 1e-5,
    "max_seq_len": 256,
}
PROMPT = 32
STEPS = 64
ROUNDS = 3
MODES = ("executorch loop", "Generator", "Generator, OMP_WAIT_POLICY=PASSIVE")
HEADERS = ("how", "decode ms", "prefill ms", "over PASSIVE")


def _child(mode: str, program: Path) -> dict[str, float]:
    import torch

    prompt = list(range(5, 5 + PROMPT))
    if mode == "executorch loop":
        from executorch.runtime import Runtime

        loaded = Runtime.get().load_program(program)  # held while its method runs
        method = loaded.load_method("forward")
        start = time.perf_counter()
        logits = method.execute([torch.tensor([prompt]), torch.tensor([0])])[0]
        prefill = 1000 * (time.perf_counter() - start)
        times, position = [], PROMPT
        for _ in range(STEPS):
            token = int(logits.reshape(-1, logits.shape[-1])[-1].argmax())
            start = time.perf_counter()
            logits = method.execute([torch.tensor([[token]]), torch.tensor([position])])[0]
            times.append(1000 * (time.perf_counter() - start))
            position += 1
        return {"decode_ms": statistics.median(times), "prefill_ms": prefill}
    from openvino_backend.llm.generate import Generator

    run = Generator(program).generate(prompt, STEPS)
    return {"decode_ms": run.ms_per_token, "prefill_ms": run.prefill_ms}


def bench_threads() -> tuple[list[list[object]], str]:
    """Rows of ``HEADERS`` and the line naming the program measured."""
    import tempfile

    from openvino_backend.llm.export import export_decoder
    from openvino_backend.llm.models import load_decoder
    from openvino_backend.program import write_program

    with tempfile.TemporaryDirectory() as tmp:
        params = Path(tmp) / "params.json"
        params.write_text(json.dumps(PARAMS))
        program = Path(tmp) / "llama.pte"
        write_program(export_decoder(load_decoder(params, max_context=PARAMS["max_seq_len"])), program)
        env = {key: value for key, value in os.environ.items() if key != "OMP_WAIT_POLICY"}
        figures: dict[str, list[dict[str, float]]] = {mode: [] for mode in MODES}
        for _ in range(ROUNDS):
            for mode in MODES:
                child_env = dict(env, OMP_WAIT_POLICY="PASSIVE") if "PASSIVE" in mode else env
                done = subprocess.run(
                    [sys.executable, __file__, mode, str(program)],
                    env=child_env,
                    capture_output=True,
                    text=True,
                    timeout=600,
                )
                lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
                if done.returncode or not lines:
                    raise RuntimeError(f"{mode}: the child ended with {done.returncode}\n{done.stderr[-2000:]}")
                figures[mode].append(json.loads(lines[-1]))
    reference = statistics.median(f["decode_ms"] for f in figures[MODES[-1]])
    rows = []
    for mode in MODES:
        decode = statistics.median(f["decode_ms"] for f in figures[mode])
        prefill = statistics.median(f["prefill_ms"] for f in figures[mode])
        rows.append([mode, f"{decode:.2f}", f"{prefill:.1f}", f"{decode / reference:.2f}x"])
    what = (
        f"Llama {PARAMS['dim']}x{PARAMS['n_layers']}, vocabulary {PARAMS['vocab_size']}, f32 weights, "
        f"{PROMPT}-token prompt in one call, {STEPS} decode calls; {ROUNDS} interleaved rounds"
    )
    return rows, what


if __name__ == "__main__":
    print(json.dumps(_child(sys.argv[1], Path(sys.argv[2]))), flush=True)
