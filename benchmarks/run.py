"""Run the capture speed and coverage benchmarks, print one summary, and update BENCHMARKS.md.

    python -m benchmarks                       # full run (ViT-Ti/16 + ViT-B/16 at batch 32, all timm ViTs)
    python -m benchmarks --batch 8 --repeats 2 --filter 'deit*' --no-train --no-inspect --no-probe  # a quick look
    python benchmarks/run.py --no-coverage     # every benchmark but coverage (its section of BENCHMARKS.md is kept)

Generated sections of BENCHMARKS.md sit between ``<!-- NAME:start -->`` / ``<!-- NAME:end -->`` markers
(``machine``, ``speed``, ``coverage``, ``train``, ``inspect``, ``probe``); everything outside them is left alone.
``make bench`` then rewrites the whole of BENCHMARKS.md from the result files (``python -m benchmarks.markdown``). A partial run (``--filter``/``--limit`` for coverage; other ``--models``, ``--batch`` or
``--repeats`` than the defaults for speed; another ``--train-steps`` or ``--inspect-model``) prints its results and writes them to ``*.partial.json`` but never
replaces the published section; the ``machine`` section is rewritten only when some section is.
"""

from __future__ import annotations

import argparse
import json
import re
import shlex
import sys
from collections import defaultdict
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import capture_coverage as coverage
from benchmarks import capture_speed as speed
from benchmarks import inspect_speed, probe_speed, train_speed
from benchmarks._util import machine_info
from vitlab.base.atomic import atomic_write_text

ROOT = Path(__file__).resolve().parents[1]


# ----------------------------------------------------------------------------------------------- markdown
def machine_section(info: dict[str, Any], argv: list[str]) -> str:
    """Bullet list describing the machine and the command of this run."""
    cmd = shlex.join(["python", "-m", "benchmarks", *argv])
    return "\n".join([
        f"- CPU: {info['cpu']}, {info['cores']} cores ({info['torch_threads']} torch threads)",
        f"- torch {info['torch']}, timm {info['timm']}, Python {info['python']}",
        f"- date: {info['date']}; load average at start (1/5/15 min): {info['load_average']}",
        f"- command: `{cmd}`",
    ])


def stamp(info: dict[str, Any]) -> str:
    """When and under which load a section was measured (sections can come from different runs)."""
    return f"Measured {info['date']}, load average at the start {info['load_average']}."


def speed_section(rows: list[speed.SpeedRow], repeats: int, info: dict[str, Any]) -> str:
    """The speed table plus the goal line."""
    worst = max(r.ratios["c/b"] for r in rows)
    verdict = "met" if worst <= speed.GOAL else "**not met**"
    return (f"{stamp(info)} {info['torch_threads']} torch threads. "
            f"Median of {repeats} timed rounds after one warm-up round, variants interleaved; "
            f"seconds per forward of the whole batch at 224 px.\n\n{speed.format_table(rows)}\n\n"
            f"{speed.format_memory_table(rows)}\n\n"
            f"Goal c/b <= {speed.GOAL}: {verdict} (worst c/b = {worst:.2f}).")


def problem_lines(results: list[coverage.Result], status: str) -> list[str]:
    """One markdown bullet per distinct architecture with ``status``: names, class, message."""
    by_arch: dict[str, list[coverage.Result]] = defaultdict(list)
    for r in results:
        if r.status == status:
            by_arch[r.arch_key].append(r)
    lines = []
    for group in by_arch.values():
        names = ", ".join(f"`{r.name}`" for r in group)
        msg = group[0].message.replace("|", "\\|")
        lines.append(f"- {names} ({group[0].module}/{group[0].cls or '?'}): {msg[:400]}")
    return lines


def coverage_section(results: list[coverage.Result], summary: dict[str, Any], seconds: float,
                     info: dict[str, Any]) -> str:
    """Count tables plus the non-captured architectures, grouped by status."""
    parts = [
        f"{stamp(info)} {len(results)} registered names, {seconds:.0f} s (1 torch thread). "
        "Each distinct architecture is run once; "
        "a group's status is its worst member's.",
        "",
        coverage.format_table(summary),
        "",
        coverage.format_module_table(summary),
    ]
    for status in ("wrong", "refused", "build_failed"):
        lines = problem_lines(results, status)
        if lines:
            parts += ["", f"**{status}** ({len(lines)} distinct architectures):", "", *lines]
    return "\n".join(parts)


def replace_section(text: str, name: str, body: str) -> str:
    """``text`` with the ``name`` marker block replaced by ``body`` (appended when the markers are missing)."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{body}\n{end}"
    pattern = re.compile(re.escape(start) + r".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    return text.rstrip() + f"\n\n{block}\n"


def update_markdown(path: Path, sections: dict[str, str]) -> None:
    """Write ``sections`` into the marker blocks of ``path`` (created if missing)."""
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    for name, body in sections.items():
        text = replace_section(text, name, body)
    atomic_write_text(path, text)  # a reader (or a kill) never sees half a file


# ----------------------------------------------------------------------------------------------- summary
def summary_table(rows: list[speed.SpeedRow], summary: dict[str, Any] | None) -> str:
    """One plain-text table: speed ratios per model, then coverage counts."""
    lines = []
    if rows:
        lines.append(f"{'speed (ratios)':<34}{'b/a':>7}{'c/b':>7}{'c/a':>7}{'d/b':>7}")
        for r in rows:
            q = r.ratios
            lines.append(f"{r.model + f' b={r.batch}':<34}{q['b/a']:>7.2f}{q['c/b']:>7.2f}{q['c/a']:>7.2f}"
                         f"{q['d/b']:>7.2f}")
    if summary:
        lines.append("")
        lines.append(f"{'coverage (counts)':<34}" + "".join(f"{s:>14}" for s in coverage.STATUSES))
        for label, key in (("per registered name", "per_name"), ("per distinct architecture", "per_architecture")):
            lines.append(f"{label:<34}" + "".join(f"{summary[key][s]:>14}" for s in coverage.STATUSES))
    return "\n".join(lines)


def save_result(folder: Path, name: str, doc: dict[str, Any], partial: bool) -> None:
    """``folder/NAME.json``, or ``NAME.partial.json`` for a partial run, which never replaces a full run's record."""
    atomic_write_text(folder / f"{name}{'.partial' if partial else ''}.json", json.dumps(doc, indent=1))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--models", nargs="+", default=list(speed.DEFAULT_MODELS))
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--filter", metavar="GLOB", help="coverage: only names matching this glob")
    p.add_argument("--limit", type=int, help="coverage: at most this many names")
    p.add_argument("--no-speed", action="store_true")
    p.add_argument("--no-coverage", action="store_true")
    p.add_argument("--no-train", action="store_true", help="skip the training-throughput benchmark")
    p.add_argument("--no-probe", action="store_true", help="skip the probing benchmark")
    p.add_argument("--no-inspect", action="store_true", help="skip the distance/rollout benchmark (ViT-B/16)")
    p.add_argument("--inspect-model", default="vit_base_patch16_224", help="inspection benchmark: timm model")
    p.add_argument("--train-steps", type=int, default=12, help="training benchmark: timed steps per variant")
    p.add_argument("--results", type=Path, default=ROOT / "benchmarks" / "results", help="JSON output folder")
    p.add_argument("--markdown", type=Path, default=ROOT / "BENCHMARKS.md")
    p.add_argument("--no-markdown", action="store_true", help="print only; leave BENCHMARKS.md alone")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = parse_args(argv)
    default = parse_args([])  # what a full run uses: a run that changes any of it publishes nothing of that part
    info = machine_info()  # load average before our own work
    args.results.mkdir(parents=True, exist_ok=True)
    sections = {"machine": machine_section(info, argv)}
    rows: list[speed.SpeedRow] = []
    summary = None
    if not args.no_speed:  # first, while nothing else of ours has touched the allocator
        rows = speed.run_speed(tuple(args.models), args.batch, args.repeats)
        partial = (tuple(args.models), args.batch, args.repeats) != (tuple(default.models), default.batch,
                                                                         default.repeats)
        save_result(args.results, "capture_speed", {"machine": info, "rows": speed.to_json(rows)}, partial)
        if not partial:  # never overwrite the full run's record
            sections["speed"] = speed_section(rows, args.repeats, info)
    if not args.no_coverage:
        cov_info = machine_info()
        results, summary, seconds = coverage.timed_coverage(args.filter, args.limit)
        partial = args.filter is not None or args.limit is not None  # never overwrite the full run's record
        name = "capture_coverage.partial.json" if partial else "capture_coverage.json"
        coverage.write_json(args.results / name, results, summary, seconds, cov_info)
        if not partial:
            sections["coverage"] = coverage_section(results, summary, seconds, cov_info)
    # each section's stamp and JSON carry the machine as its benchmark started: "load average at the start" is the
    # load before the benchmark's own work, not the load it leaves behind
    if not args.no_train:
        train_info = machine_info()
        train_res = {"machine": train_info, **train_speed.run(steps=args.train_steps)}  # its own start stamp wins
        partial = args.train_steps != default.train_steps
        save_result(args.results, "train_speed", train_res, partial)
        if not partial:
            sections["train"] = (f"{stamp(train_res['machine'])} {train_res['data']}, {train_res['steps']} timed steps "
                                 f"per variant, {train_res['threads']} torch threads.\n\n"
                                 f"{train_speed.format_table(train_res)}")
        print("\n" + train_speed.format_table(train_res))
    if not args.no_inspect:
        inspect_info = machine_info()
        res = inspect_speed.run(args.inspect_model)
        partial = args.inspect_model != default.inspect_model
        save_result(args.results, "inspect_speed", {"machine": inspect_info, **res}, partial)
        if not partial:
            sections["inspect"] = (f"{stamp(inspect_info)} `{res['model']}` at {res['img_size'][0]} px (random "
                                   f"weights: speed does not depend on them), {res['threads']} torch threads, one "
                                   f"timed run each, in one process.\n\n{inspect_speed.format_table(res)}")
        print("\n" + inspect_speed.format_table(res))
    if not args.no_probe:
        probe_info = machine_info()
        res = probe_speed.run()
        save_result(args.results, "probe_speed", {"machine": probe_info, **res}, partial=False)
        sections["probe"] = (f"{stamp(probe_info)} Embedded default model, {res['train']} training and "
                             f"{res['test']} test images of {res['data']}, {res['seeds']} seeds (median time, mean "
                             f"accuracy), {res['threads']} torch threads.\n\n{probe_speed.format_table(res)}")
        print("\n" + probe_speed.format_table(res))
    print(summary_table(rows, summary))
    if args.no_markdown:
        return 0
    if len(sections) == 1:  # the machine alone: a partial run, nothing of it is published
        print(f"\na partial run: {args.markdown} left as it was (results in {args.results}/*.partial.json)")
        return 0
    update_markdown(args.markdown, sections)
    print(f"\nupdated {args.markdown}: {', '.join(sorted(sections))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
