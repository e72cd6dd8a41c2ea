"""``python -m bench [MODE]``: this backend against ExecuTorch's backends, plain OpenVINO, OpenVINO GenAI
and llama.cpp. Without a mode: the dynamic-shape and INT8 tables, then lowering and inference of the
built-in models against ExecuTorch 1.5.1's OpenVINO backend (``bench/lowering.py``). Each mode is a
module of ``bench/``; ``bench/harness.py`` times, runs children and prints the tables for all of them.
"""

from __future__ import annotations

import argparse
import logging
import sys
import warnings

MODES = {
    "--peers": "ours vs XNNPACK vs OpenVINO alone on 21 transformers architectures, f32 and INT8",
    "--dynamic": "only the dynamic-shape table",
    "--int8": "only the INT8 table",
    "--large": "only the large decoder's lowering, with this package's stages",
    "--llm": "decoders: decode, prefill, weights, per-call cost (with --anchors or --real: those instead)",
    "--scale": "decoders at real sizes (random weights): export peak memory and time, the program from its file",
    "--families": "every causal-LM family of transformers through export-llm",
}


def parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    modes = parser.add_mutually_exclusive_group()
    for flag, help in MODES.items():
        modes.add_argument(flag, action="store_true", help=help)
    modes.add_argument(
        "--ab", nargs=2, metavar=("A.pte", "B.pte"), help="two programs of one decoder in one process, alternating"
    )
    parser.add_argument("--quick", action="store_true", help="fewer models and repetitions")
    parser.add_argument("--models", nargs="+", help="--peers: only these models")
    parser.add_argument("--no-int8", action="store_true", help="--peers: f32 only")
    parser.add_argument("--anchors", action="store_true", help="--llm: ours against OpenVINO GenAI and llama.cpp")
    parser.add_argument("--working-size", action="store_true", help="--anchors: and a 1.1 B Llama against GenAI")
    parser.add_argument("--real", action="store_true", help="--llm: a trained checkpoint (SmolLM2-135M-Instruct)")
    parser.add_argument(
        "--weights", nargs="+", choices=("f32", "int8", "int4"), help="--anchors, --scale: only these weights"
    )
    parser.add_argument("--rounds", type=int, help="--anchors (default 5), --ab (default 8): interleaved rounds")
    parser.add_argument("--prompt-tokens", type=int, metavar="N", help="--anchors, --ab: the prompt's length (56)")
    parser.add_argument("--steps", type=int, default=24, help="--ab: decode calls per round")
    parser.add_argument("--shapes", nargs="+", help="--scale: only these shapes (bench/scale.py's SHAPES)")
    return parser


def main(argv: list[str] | None = None) -> int:
    cli = parser()
    args = cli.parse_args(argv)
    if (args.anchors or args.real) and not args.llm:
        cli.error("--anchors and --real go with --llm")
    if args.working_size and not args.anchors:
        cli.error("--working-size goes with --llm --anchors")
    if args.models and not args.peers:
        cli.error("--models goes with --peers")
    prompt_tokens = 56 if args.prompt_tokens is None else args.prompt_tokens
    if args.anchors:
        from bench.anchors import check_prompt_tokens

        try:
            check_prompt_tokens(prompt_tokens)
        except ValueError as error:
            cli.error(f"--prompt-tokens: {error}")
    if args.peers:
        from bench.peers import PEERS, QUICK

        if unknown := sorted(set(args.models or ()) - set(PEERS)):
            cli.error(f"--models {' '.join(unknown)}: known models are {', '.join(PEERS)}")
    if args.scale:
        from bench.scale import SHAPES

        if unknown := sorted(set(args.shapes or ()) - set(SHAPES)):
            cli.error(f"--shapes {' '.join(unknown)}: known shapes are {', '.join(SHAPES)}")
    warnings.filterwarnings("ignore")
    logging.basicConfig(level=logging.ERROR)
    if args.ab:
        from bench.llm import ab

        ab(*args.ab, list(range(5, 5 + prompt_tokens)), args.steps, args.rounds or 8)
        return 0
    from bench.harness import header

    print(header())
    reps, iterations = (3, 20) if args.quick else (7, 100)
    if args.peers:
        from bench.peers import run

        run(args.models or list(QUICK if args.quick else PEERS), int8=not args.no_int8)
    elif args.llm and args.anchors:
        from bench.anchors import ROUNDS, WEIGHTS, run

        run(args.working_size, tuple(args.weights or WEIGHTS), args.rounds or ROUNDS, prompt_tokens)
    elif args.llm and args.real:
        from bench.real_checkpoint import run

        run()
    elif args.llm:
        from bench.llm import run

        run(args.quick)
    elif args.scale:
        from bench.scale import run

        run(args.shapes or list(SHAPES), args.weights or ["f32"])
    elif args.families:
        from bench.families import run

        run()
    elif args.large:
        from bench.lowering import run_large

        run_large(args.quick)
    else:
        from bench import dynamic, int8, lowering

        if not args.int8:
            dynamic.run(reps, iterations)
        if not args.dynamic:
            int8.run(reps, iterations)
        if not (args.dynamic or args.int8):
            lowering.run(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main())
