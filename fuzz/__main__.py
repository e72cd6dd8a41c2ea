"""``python -m fuzz``: search for identity-like graphs the backend gets wrong.

Prints a summary (graphs tried, ran and matched, rejected at export by error
class, failures, graphs per second) and exits 1 if any graph failed; the
failure is shrunk by hypothesis and printed as a runnable reproduction.
"""

from __future__ import annotations

import argparse
import logging
import sys
import time
import warnings
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor

from hypothesis import given, seed, settings
from hypothesis.strategies import SearchStrategy

from fuzz.graphs import compute_graphs, graphs
from fuzz.profiles import PROFILES
from fuzz.properties import Outcome, check_compute, check_lowering, check_validator
from fuzz.spec import GraphSpec
from fuzz.speed import cache_cia_op_collection

# property -> (check, the graphs it draws)
CHECKS: dict[str, tuple[Callable[[GraphSpec], Outcome], Callable[[], SearchStrategy[GraphSpec]]]] = {
    "lowering": (check_lowering, graphs),
    "validator": (check_validator, graphs),
    "compute": (check_compute, compute_graphs),
}


class GraphFailure(AssertionError):
    pass


def run_property(
    name: str, examples: int | None, profile: str, seed_value: int | None
) -> tuple[Counter, float, str | None, dict[str, str]]:
    _quiet()
    cache_cia_op_collection()
    check, strategy = CHECKS[name]
    counts: Counter = Counter()
    narrowed: dict[str, str] = {}  # op the numerical check kept out -> one of its reasons
    overrides = {"max_examples": examples} if examples else {}

    @settings(settings.get_profile(profile), **overrides)
    @given(strategy())
    def prop(spec: GraphSpec) -> None:
        outcome = check(spec)
        counts["tried"] += 1
        kind = outcome.kind if outcome.error_class is None else f"{outcome.kind}: {outcome.error_class}"
        counts[kind] += 1
        if spec.dynamic_size is not None:
            counts[f"{kind} (dynamic dim)"] += 1
        for op, why in outcome.narrowed:
            counts[f"narrowed by the numerical check: {op}"] += 1
            narrowed.setdefault(op, why)
        if outcome.kind == "failed":
            raise GraphFailure(f"{outcome.error_class}: {outcome.detail}\n\nReproduction:\n\n{spec.repro()}")

    if seed_value is not None:
        prop = seed(seed_value)(prop)
    start = time.perf_counter()
    failure = None
    try:
        prop()
    except GraphFailure as error:
        failure = str(error)
    return counts, time.perf_counter() - start, failure, narrowed


def summarize(name: str, counts: Counter, elapsed: float, failure: str | None, narrowed: dict[str, str]) -> None:
    tried = counts.pop("tried", 0)
    print(f"== {name}: {tried} graphs in {elapsed:.1f} s ({tried / elapsed if elapsed else 0:.2f} graphs/s)")
    for kind, n in sorted(counts.items()):
        print(f"   {kind:40s} {n:6d}  ({100 * n / max(tried, 1):.1f}%)")
    for op, why in sorted(narrowed.items()):
        print(f"   numerical check, {op}: {why}")
    if failure:
        print(f"   FAILED (shrunk):\n{failure}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m fuzz", description=__doc__)
    parser.add_argument("--examples", type=int, help="graphs per property (default: the profile's)")
    parser.add_argument("--seed", type=int, help="hypothesis seed (the ci profile is derandomized already)")
    parser.add_argument("--profile", choices=PROFILES, default="dev")
    parser.add_argument("--property", choices=(*CHECKS, "all"), default="all")
    parser.add_argument("--jobs", type=int, default=2, help="properties run in parallel processes (default 2)")
    args = parser.parse_args(argv)
    _quiet()

    names = list(CHECKS) if args.property == "all" else [args.property]
    jobs = [(name, args.examples, args.profile, args.seed) for name in names]
    if args.jobs > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=min(args.jobs, len(jobs))) as pool:
            results = list(pool.map(run_property, *zip(*jobs, strict=True)))
    else:
        results = [run_property(*job) for job in jobs]
    failed = False
    for name, (counts, elapsed, failure, narrowed) in zip(names, results, strict=True):
        summarize(name, counts, elapsed, failure, narrowed)
        failed |= failure is not None
    print("fuzz: FAILED" if failed else "fuzz: no failures")
    return 1 if failed else 0


def _quiet() -> None:
    logging.basicConfig(level=logging.ERROR)
    warnings.filterwarnings("ignore")


if __name__ == "__main__":
    sys.exit(main())
