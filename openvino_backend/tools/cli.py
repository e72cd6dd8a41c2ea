"""``python -m openvino_backend``: verify, lower and probe from the command line.

Exit codes: 0 success (all outputs match / no bug), 1 mismatch (or, for
``probe``, the OpenVINO bug is present), 2 export refused, 3 bad usage, or a
model, program or input the command refuses, 4 an internal error (rerun with
``--debug`` for the traceback). Every failure prints one line saying why.
"""

from __future__ import annotations

import argparse
import ctypes
import logging
import sys
import traceback
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import NoReturn

from openvino_backend.diagnostics import OpenvinoExportError
from openvino_backend.llm.models import ModelSourceError
from openvino_backend.runtime import PRECISIONS
from openvino_backend.tools import commands
from openvino_backend.tools.loader import (
    LoadError,
)
from openvino_backend.tools.quiet import stderr
from openvino_backend.tools.results import EXIT_INTERNAL, EXIT_REFUSED, EXIT_USAGE, UsageError


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

    llm = commands.add_parser(
        "export-llm",
        help="export a decoder LLM (its KV cache in OpenVINO state, prompts of any length in one call)",
    )
    llm.add_argument(
        "model",
        type=Path,
        help="ExecuTorch's example Llama: a params.json (or a directory holding one and its checkpoint); "
        "or a Hugging Face model directory (config.json, weights if any, tokenizer)",
    )
    llm.add_argument("-o", "--output", type=Path, required=True, metavar="FILE.pte")
    llm.add_argument("--checkpoint", type=Path, help="weights for the example Llama (default: random)")
    llm.add_argument("--max-seq-len", "--max_seq_len", type=int, default=128, help="context length (default 128)")
    llm.add_argument(
        "--disable-dynamic-shapes",
        "--disable_dynamic_shapes",
        action="store_true",
        help="one token per call, prompt included (default: a prompt of any length in one call)",
    )
    llm.add_argument(
        "--weights",
        choices=("f32", "int8", "int4"),
        default="f32",
        help="weights kept compressed in OpenVINO: int8 (asymmetric, per channel; --sym: symmetric) or int4 "
        "(symmetric, groups of 128), NNCF's scheme; default f32",
    )
    llm.add_argument(
        "--sym",
        action="store_true",
        help="8-bit weights symmetric, without a zero point (as optimum-cli's --sym; 4-bit weights always are)",
    )
    llm.add_argument(
        "--qlinear",
        choices=("8w", "4w"),
        help="optimum-executorch's spelling of --weights int8 / int4",
    )
    llm.add_argument(
        "--calibration-prompt",
        action="append",
        default=[],
        metavar="TEXT",
        help="with int4: a prompt (tokenized with the model's tokenizer) for AWQ and scale estimation; repeatable",
    )
    llm.add_argument(
        "--ratio",
        type=float,
        help="with int4: the share of the layers in 4 bits, the rest (those NNCF ranks most sensitive) in "
        "8 bits; default 1",
    )
    llm.add_argument(
        "--group-size",
        "--group_size",
        type=int,
        help="with int4: weights per scale (default 128; a layer whose width is no multiple of it takes smaller "
        "groups)",
    )
    llm.add_argument("--debug", action="store_true", help="tracebacks and library logs")

    gen = commands.add_parser("generate", help="generate text from an exported LLM on ExecuTorch's runtime")
    gen.add_argument("program", type=Path, metavar="FILE.pte")
    prompt = gen.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="text, encoded with the tokenizer")
    prompt.add_argument("--prompt-ids", metavar="ID,ID,..", help="token ids (no tokenizer needed)")
    gen.add_argument(
        "--tokenizer",
        type=Path,
        help="tokenizer.json or tokenizer.model (default: the one export-llm wrote beside the program)",
    )
    gen.add_argument("--max-new-tokens", type=int, default=32)
    gen.add_argument(
        "--runner",
        choices=("python", "executorch"),
        default="python",
        help="python: this package's loop on executorch.runtime (default); executorch: ExecuTorch's C++ "
        "TextLLMRunner, the code its apps embed (needs --prompt and a tokenizer)",
    )
    gen.add_argument("--debug", action="store_true", help="tracebacks and library logs")

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
            return commands.probe_command(args)
        if args.command == "lower":
            return commands.lower(args)
        if args.command == "export-llm":
            return commands.export_llm(args)
        if args.command == "generate":
            return commands.generate(args)
        return commands.verify(args)
    except (LoadError, UsageError, ModelSourceError) as error:
        if args.debug:
            traceback.print_exc()
        print(f"error: {error}", file=stderr())
        return EXIT_USAGE
    except OpenvinoExportError as error:  # commands print their refusals; one that escaped them still says why
        if args.debug:
            traceback.print_exc()
        print(f"export refused: {error}", file=stderr())
        return EXIT_REFUSED
    except KeyboardInterrupt:
        print("interrupted", file=stderr())
        return 130
    except Exception as error:  # never exit in silence: stderr is the null device unless --debug
        if args.debug:
            traceback.print_exc()
        first = str(error).strip().splitlines()[0] if str(error).strip() else ""
        print(
            f"error: {args.command} failed: {type(error).__name__}{': ' + first if first else ''}\n"
            f"  an internal error of openvino-backend or a library it calls: rerun with --debug for the traceback",
            file=stderr(),
        )
        return EXIT_INTERNAL


# glibc's mallopt parameter: allocations from this size up are mapped on their own, and unmapped when freed.
M_MMAP_THRESHOLD = -3


def return_freed_memory(threshold: int = 1 << 20) -> bool:
    """Give freed buffers of ``threshold`` bytes or more back to the system at once (glibc).

    By default glibc raises that threshold to the size of each large block freed (up to 32 MB) and keeps
    later blocks below it in its heap, where a block still in use above them pins every freed one: an
    export frees a model's worth of tensors between stages and the process kept them (SmolLM2-135M int4
    at context 2048: peak 4.2 GB, 3.4 GB with this). False where the C library has no ``mallopt``."""
    try:
        return bool(ctypes.CDLL(None).mallopt(M_MMAP_THRESHOLD, threshold))
    except (OSError, AttributeError):  # not glibc
        return False


def _quiet_libraries(debug: bool) -> None:
    # force: an import may have configured the root logger already (ExecuTorch's XNNPACK partitioner
    # does, at WARNING), which would hide this package's INFO logs from --debug.
    logging.basicConfig(
        level=logging.INFO if debug else logging.ERROR, format="%(levelname)s %(name)s: %(message)s", force=True
    )
    if not debug:
        warnings.filterwarnings("ignore")


if __name__ == "__main__":
    sys.exit(main())
