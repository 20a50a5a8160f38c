"""``python -m rlpost.support [ARCH ...] [--render] [--in-repo] [--work DIR]``: see
``rlpost.support``."""

from __future__ import annotations

import argparse
import shutil
import sys
import tempfile
import time
from pathlib import Path

from rlpost.support.common import STEPS, Outcome, architectures
from rlpost.support.report import MARKDOWN, TITLES, write_markdown
from rlpost.support.runner import RESULTS_DIR, check_architecture, device_kind, save_record

MARKS = {"pass": "✓", "fail": "✗", "skip": "–"}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m rlpost.support",
        description="Run the support checks on tiny models of each architecture and "
        "regenerate SUPPORT.md.",
    )
    known = architectures()
    parser.add_argument(
        "archs", nargs="*", help=f"transformers classes (default: all): {', '.join(known)}"
    )
    parser.add_argument(
        "--render", action="store_true", help="only rewrite SUPPORT.md from the stored results"
    )
    parser.add_argument(
        "--in-repo",
        action="store_true",
        help=f"store results in {RESULTS_DIR} and write {MARKDOWN} (the checkout's tracked "
        "files) instead of outputs/support/",
    )
    parser.add_argument("--results", type=Path, default=None, help="where results are stored")
    parser.add_argument("--markdown", type=Path, default=None, help="the file to write")
    parser.add_argument(
        "--work",
        type=Path,
        default=None,
        help="models and runs go here (kept); default: a temporary directory",
    )
    args = parser.parse_args(argv)
    local = Path("outputs") / "support"
    args.results = args.results or (RESULTS_DIR if args.in_repo else local / "results")
    args.markdown = args.markdown or (MARKDOWN if args.in_repo else local / "SUPPORT.md")
    unknown = [a for a in args.archs if a not in known]
    if unknown:
        parser.error(f"unknown architectures {unknown}; choose from {', '.join(known)}")
    if not args.render:
        run(args.archs or known, args.results, args.work)
    print(f"wrote {write_markdown(args.results, args.markdown)}")
    return 0


def run(archs: list[str], results: Path, work: Path | None) -> None:
    device = device_kind()
    root = work or Path(tempfile.mkdtemp(prefix="rlpost-support-"))
    counts = {"pass": 0, "fail": 0, "skip": 0}
    start = time.perf_counter()
    try:
        for i, arch in enumerate(archs, 1):
            print(f"[{i}/{len(archs)}] {arch} ({device})", flush=True)

            def report(check: str, outcome: Outcome, seconds: float) -> None:
                counts[outcome.status] += 1
                print(
                    f"    {TITLES[check]:14s} {MARKS[outcome.status]} {seconds:6.1f} s  {outcome.text}",
                    flush=True,
                )

            arch_start = time.perf_counter()
            checks = check_architecture(arch, root / arch, tuple(STEPS), report)
            save_record(arch, device, checks, time.perf_counter() - arch_start, results)
    finally:
        if work is None:
            shutil.rmtree(root, ignore_errors=True)
    minutes = (time.perf_counter() - start) / 60
    print(
        f"{len(archs)} architectures in {minutes:.1f} min: {counts['pass']} ✓, "
        f"{counts['fail']} ✗, {counts['skip']} not reached",
        flush=True,
    )


if __name__ == "__main__":
    sys.exit(main())
