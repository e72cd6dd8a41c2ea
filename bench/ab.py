"""Two programs of the same decoder, A against B, in one process (``python -m bench.ab A.pte B.pte``).

Separate processes run minutes apart on a shared machine, where a run's figures spread 1.5x-2x;
a change worth 10% disappears in that. Here both programs are loaded from their files into one
process and measured in alternating rounds: each round prefills the prompt in one call from
position 0 (the same loaded method, as a runner serves a new conversation) and decodes ``--steps``
tokens, each the argmax of the last logits. The figure is the median over rounds of B's time over
A's, which drifts of the machine affect alike. The programs' first logits are compared too.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

from bench.decode import decode_ms, prefill

from executorch.runtime import Runtime  # isort: skip (bench.decode sets OMP_WAIT_POLICY first)


def main() -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab")
    parser.add_argument("a", help="the reference .pte (its method takes tokens [1, n] and a start [1])")
    parser.add_argument("b", help="the .pte measured against it")
    parser.add_argument("--prompt", default=",".join(map(str, range(5, 61))), help="token ids, comma-separated")
    parser.add_argument("--steps", type=int, default=24, help="decode calls per round")
    parser.add_argument("--rounds", type=int, default=8)
    args = parser.parse_args()
    prompt = [int(t) for t in args.prompt.split(",")]
    programs = [Runtime.get().load_program(Path(path)) for path in (args.a, args.b)]  # held while they run
    methods = [program.load_method("forward") for program in programs]
    first = [prefill(method, prompt, one_call=True)[0] for method in methods]  # each shape's set-up, once
    difference = (first[0] - first[1]).abs().max().item()
    figures: list[list[tuple[float, float]]] = [[], []]
    for _ in range(args.rounds):
        for method, rows in zip(methods, figures, strict=True):
            logits, prefill_ms = prefill(method, prompt, one_call=True)
            rows.append((prefill_ms, decode_ms(method, logits, len(prompt), args.steps)))
    print(f"A {args.a}\nB {args.b}\nfirst logits, largest difference: {difference:.3g}")
    for name, index in (("prefill", 0), ("decode", 1)):
        a = statistics.median(row[index] for row in figures[0])
        b = statistics.median(row[index] for row in figures[1])
        ratio = statistics.median(y[index] / x[index] for x, y in zip(figures[0], figures[1], strict=True))
        print(f"{name} ms: A {a:.2f}  B {b:.2f}  B/A {ratio:.3f} (median of {args.rounds} rounds' ratios)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
