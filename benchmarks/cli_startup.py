"""Command-line start-up: the wall time of ``vitlab --help`` and ``vitlab train --help`` against, measured in the
same process, that of ``python -c "import torch, timm"`` (what every ``--help`` paid while ``import vitlab`` loaded
them) and of ``python -c pass`` (the interpreter alone).

    python benchmarks/cli_startup.py [--rounds 5] [--out benchmarks/results/cli_startup.json]

Each is a fresh subprocess of this Python importing this checkout; one untimed round first (the files in the page
cache: warm numbers), then ``--rounds`` rounds with the commands interleaved; the median of each.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._util import machine_info, report

ROOT = Path(__file__).resolve().parents[1]

#: name -> the arguments after ``python``
COMMANDS = {
    "help": ["-m", "vitlab.cli", "--help"],
    "train_help": ["-m", "vitlab.cli", "train", "--help"],
    "import_torch_timm": ["-c", "import torch, timm"],
    "python": ["-c", "pass"],
}


def _seconds(args: list[str]) -> float:
    """Wall time of one ``python ARGS`` run from this checkout (it must succeed)."""
    t = time.perf_counter()
    subprocess.run([sys.executable, *args], check=True, stdout=subprocess.DEVNULL, cwd=ROOT,
                   env={**os.environ, "PYTHONPATH": str(ROOT)})
    return time.perf_counter() - t


def run(rounds: int = 5) -> dict:
    for args in COMMANDS.values():  # untimed: the page cache
        _seconds(args)
    times: dict[str, list[float]] = {name: [] for name in COMMANDS}
    for _ in range(rounds):
        for name, args in COMMANDS.items():
            times[name].append(_seconds(args))
    median = {name: statistics.median(t) for name, t in times.items()}
    return {"rounds": rounds, "seconds": times, "median_s": median,
            "ratios": {"help/import_torch_timm": median["help"] / median["import_torch_timm"],
                       "train_help/import_torch_timm": median["train_help"] / median["import_torch_timm"],
                       "help/python": median["help"] / median["python"]}}


def format_table(res: dict) -> str:
    m, q = res["median_s"], res["ratios"]
    rows = [("`vitlab --help`", m["help"], f"{q['help/import_torch_timm']:.3f}", f"{q['help/python']:.1f}"),
            ("`vitlab train --help`", m["train_help"], f"{q['train_help/import_torch_timm']:.3f}", ""),
            ('`python -c "import torch, timm"`', m["import_torch_timm"], "1", ""),
            ("`python -c pass`", m["python"], "", "1")]
    return "\n".join([f"| command | median s of {res['rounds']} | / import torch, timm | / python |", "|---|---|---|---|",
                      *(f"| {c} | {s:.3f} | {a} | {b} |" for c, s, a, b in rows)])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--out", default="benchmarks/results/cli_startup.json")
    a = ap.parse_args(argv)
    res = {"machine": machine_info(), **run(a.rounds)}
    return report(res, format_table(res), a.out)


if __name__ == "__main__":
    raise SystemExit(main())
