"""The headline figure: test accuracy against training hours of a run that starts from random weights.

    python benchmarks/from_scratch.py --run-dir ~/.cache/vitlab/runs/scratch5h \
        [--goal 0.9] [--budget-hours 5] [--fit] [--out benchmarks/results/from_scratch.json]

It reads a ``vitlab train`` run folder (``metrics.jsonl``, ``train_config.json``), measures nothing (but --fit), and writes
the learning curve (cumulative wall clock of training and evaluation, ``vitlab.train.history.training_curve``) as JSON and
as a plotly PNG beside it, with the goal line and the time budget. The verdict is the curve's: the first evaluated
point at or above the goal within the budget, else the best point within it. Hours on a machine that also ran other
work overstate what an idle one needs; the JSON lists the epochs that ran slower than the run's median by more than
a third (``slow_epochs``), so a reader can tell. With ``--fit`` it also reads the run's last checkpoint against its
teacher on training images and on the test set (``fit``): a student far below its teacher on images it trained on
underfits, so the lever is faster learning, not more regularisation.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._util import report
from vitlab.base.errors import ModelLoadError
from vitlab.train.history import read_history, training_curve

RESULTS = Path(__file__).resolve().parent / "results"


def verdict(hours: list[float], accuracy: list[float], goal: float, budget_hours: float) -> dict[str, Any]:
    """Whether the curve reaches ``goal`` within ``budget_hours``: ``reached`` with the first such point (hours,
    accuracy), else the best point within the budget (``None`` when no point is within it)."""
    inside = [(h, a) for h, a in zip(hours, accuracy) if h <= budget_hours]
    hit = next(((h, a) for h, a in inside if a >= goal), None)
    best = max(inside, key=lambda p: p[1], default=None)
    point = hit or best
    return {"goal": goal, "budget_hours": budget_hours, "reached": hit is not None,
            "hours": None if point is None else point[0], "accuracy": None if point is None else point[1]}


def slow_epochs(history: list[dict], factor: float = 4 / 3) -> list[int]:
    """Epochs whose training took more than ``factor`` times the run's median epoch (another process on the CPU,
    or a compile), in order."""
    times = [h["epoch_seconds"] for h in history if "epoch_seconds" in h]
    if not times:
        return []
    median = statistics.median(times)
    return [h["epoch"] for h in history if h.get("epoch_seconds", 0.0) > factor * median]


def run(run_dir: Path, goal: float, budget_hours: float) -> dict[str, Any]:
    metrics, config = run_dir / "metrics.jsonl", run_dir / "train_config.json"
    if not metrics.is_file() or not config.is_file():
        raise FileNotFoundError(f"{run_dir} is not a vitlab train run folder (no metrics.jsonl or train_config.json); "
                                "pass the --run-dir a `vitlab train` run wrote")
    history = read_history(run_dir)
    cfg = json.loads(config.read_text())
    if cfg.get("init_from"):
        raise ValueError(f"{run_dir} was warm-started from {cfg['init_from']}: its hours do not count from random "
                         "weights; this figure is for a run that starts from scratch")
    hours, acc = training_curve(history)
    return {"run_dir": run_dir.name, "epochs_done": len(history), "epochs_planned": cfg.get("epochs"),
            "train_config": {k: cfg[k] for k in ("epochs", "batch_size", "lr", "randaugment", "mixup_prob",
                                                   "distill_tta", "teacher", "progressive_size", "progressive_epochs",
                                                   "progressive_fraction", "full_token_epochs") if k in cfg},
            "patch_drop_rate": (cfg.get("model") or {}).get("patch_drop_rate"),
            "epochs_evaluated": [h["epoch"] for h in history if h.get("test_accuracy") is not None],
            "hours": hours, "test_accuracy": acc, "slow_epochs": slow_epochs(history),
            "verdict": verdict(hours, acc, goal, budget_hours)}


def fit(run_dir: Path, train_images: int = 5000, seed: int = 0) -> dict[str, Any]:
    """Under- or over-fitting, from the run's last checkpoint (``run_dir/checkpoint``): ``vitlab.train.export.
    distillation_facts`` (each head's accuracy, the teacher's, their agreement; fp32, each model's eval transform) on
    ``train_images`` training images drawn without replacement by a seeded permutation from those the run trained
    on (its ``max_train_examples`` draw, ``vitlab.train.loop.training_subset``, where set; no augmentation: the images as stored) and on the whole test
    set, both from the run's own data set and teacher. The teacher is scored by its plain forward, also for a run
    that learned from its mirrored targets (``distill_tta``)."""
    import torch

    from vitlab.data.datasets import load_splits
    from vitlab.models.checkpoint import load_checkpoint
    from vitlab.train.distill import load_teacher
    from vitlab.train.export import distillation_facts
    from vitlab.train.loop import training_subset

    cfg = json.loads((run_dir / "train_config.json").read_text())
    if not cfg.get("teacher") or not (cfg.get("model") or {}).get("distilled"):
        raise ValueError(f"{run_dir} trained no distilled student (teacher={cfg.get('teacher')!r}): --fit compares a "
                         "distilled ViT with its teacher; leave --fit off for this run")
    if not (run_dir / "checkpoint" / "config.json").is_file():
        raise FileNotFoundError(f"{run_dir / 'checkpoint'} holds no checkpoint yet: --fit reads the run's last one, "
                                "written after each epoch; let `vitlab train` finish an epoch first")
    if not cfg.get("data"):
        raise ValueError(f"{run_dir / 'train_config.json'} names no data set ('data'): --fit needs the run's own")
    student = load_checkpoint(run_dir / "checkpoint")
    try:
        teacher = load_teacher(cfg["teacher"], torch.device("cpu"))
    except FileNotFoundError as e:
        raise FileNotFoundError(f"--fit needs the run's teacher {cfg['teacher']!r}, which is not here ({e})") from e
    train, test = load_splits(cfg["data"])
    seen = training_subset(train, cfg.get("max_train_examples"), cfg.get("seed", 0))  # the images the run trained on
    n = min(train_images, len(seen))
    idx = torch.randperm(len(seen), generator=torch.Generator().manual_seed(seed))[:n]  # (n,)
    return {"train_images": n, "seed": seed, "train": distillation_facts(student, teacher, seen.subset(idx)),
            "test": distillation_facts(student, teacher, test)}


def figure(res: dict[str, Any]):
    from vitlab.figures.plots import learning_curve

    v = res["verdict"]
    fig = learning_curve(res["hours"], res["test_accuracy"], goal=v["goal"],
                         title=f"{res['run_dir']}: test accuracy against training hours, from random weights<br>"
                               f"<sup>{res['epochs_done']} of {res['epochs_planned']} epochs · {_said(v)}</sup>")
    fig.add_vline(x=v["budget_hours"], line_dash="dot", line_color="firebrick",
                  annotation_text=f"budget {v['budget_hours']:g} h", annotation_position="bottom right")
    return fig


def format_table(res: dict[str, Any]) -> str:
    v = res["verdict"]
    lines = ["| epoch | hours | test accuracy |", "|---|---|---|"]
    lines += [f"| {e} | {h:.2f} | {a:.2%} |" for e, h, a in zip(res["epochs_evaluated"], res["hours"],
                                                                 res["test_accuracy"])]
    lines.append(f"\n{_said(v)}.")
    if f := res.get("fit"):
        lines += ["", "| images | student (readout) | teacher | student takes the teacher's decision |",
                  "|---|---|---|---|"]
        lines += [f"| {name} | {f[k]['readout']:.2%} | {f[k]['teacher']:.2%} | "
                  f"{f[k]['readout_agrees_with_teacher']:.2%} |"
                  for k, name in (("train", f"{f['train_images']} training images"), ("test", "test set"))]
    return "\n".join(lines)


def _said(v: dict[str, Any]) -> str:
    """The verdict in words."""
    if v["hours"] is None:
        return f"goal {v['goal']:.0%} within {v['budget_hours']:g} h: no evaluated point within the budget"
    said = "reached:" if v["reached"] else "not reached; best within the budget"
    return f"goal {v['goal']:.0%} within {v['budget_hours']:g} h {said} {v['accuracy']:.2%} at {v['hours']:.2f} h"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--run-dir", type=Path, default=Path.home() / ".cache" / "vitlab" / "runs" / "scratch5h")
    ap.add_argument("--goal", type=float, default=0.9)
    ap.add_argument("--budget-hours", type=float, default=5.0)
    ap.add_argument("--fit", action="store_true", help="also read the last checkpoint against its teacher on "
                    "training and test images (under- or over-fitting; about a minute of CPU)")
    ap.add_argument("--out", type=Path, default=RESULTS / "from_scratch.json")
    args = ap.parse_args(argv)
    try:
        res = run(args.run_dir.expanduser(), args.goal, args.budget_hours)
        if args.fit:
            res["fit"] = fit(args.run_dir.expanduser())
    except (FileNotFoundError, ValueError, ModelLoadError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    from vitlab.figures.static import write_images

    png = args.out.with_suffix(".png")
    res["figure"] = write_images([figure(res)], [png], scale=2)
    return report(res, format_table(res), args.out)


if __name__ == "__main__":
    raise SystemExit(main())
