"""What the JPEG compression of the shared CIFAR-10 costs a model: the same preset on the images re-encoded at lower
qualities, against the images as they are.

    python benchmarks/jpeg_quality.py --qualities 50 25 [--preset resnet_cifar10_fast] [--data DIR]
        [--cache ~/.cache/vitlab/jpeg] [--runs ~/.cache/vitlab/runs] [--out benchmarks/results/jpeg_quality.json]

The shared data set is JPEG (``../shared/datasets/cifar10``); its originals are not here, so what compression costs
cannot be measured against them. What can be measured is the slope: each quality in ``--qualities`` re-encodes both
splits (PIL, IJG tables at that quality, 4:2:0 chroma, as the shared files are) into ``CACHE/qQ/{train,test}.zip``
(outside the project; written atomically, reused when present), trains the preset on them (``vitlab train --set
data=CACHE/qQ``, resuming a run folder that holds a checkpoint), and the table sets each run's final test accuracy
(and with TTA) against the run on the images as they are (``RUNS/jpeg_PRESET_qS`` with S the shared files' own quality,
estimated from their quantisation tables). Each quality step here (75, 50, 25) doubles the quantisation steps;
the points lost per doubling show whether the shared files sit where compression still costs (the drop per
doubling holds up to them) or where it has stopped mattering (it shrinks toward them). Short of the originals,
that is a direction, not the size of their cost.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import zipfile
from pathlib import Path
from typing import Any

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from PIL import Image

from benchmarks._util import report
from vitlab.base.atomic import atomic_write
from vitlab.train.history import read_history, run_hours

RESULTS = Path(__file__).resolve().parent / "results"
SHARED = Path(__file__).resolve().parents[2] / "shared" / "datasets" / "cifar10"


def _luma_table(data: bytes) -> list[int]:
    return list(Image.open(io.BytesIO(data)).quantization[0])


def jpeg_quality(data: bytes) -> int | None:
    """The IJG quality (1-100) whose luminance table PIL writes equal to this JPEG's, or None (non-IJG tables)."""
    table = _luma_table(data)
    probe = Image.new("RGB", (8, 8))
    for q in range(1, 101):
        buf = io.BytesIO()
        probe.save(buf, "JPEG", quality=q)
        if _luma_table(buf.getvalue()) == table:
            return q
    return None


def reencode_zip(src: Path, dst: Path, quality: int) -> dict[str, Any]:
    """Every ``.jpg`` member of ``src`` decoded and saved again at ``quality`` (4:2:0) under the same name in ``dst``
    (stored, written atomically); other members are left out. Returns counts and mean bytes per image."""
    stats = {"images": 0, "bytes_before": 0, "bytes_after": 0}

    def write(tmp: str) -> None:
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(tmp, "w", zipfile.ZIP_STORED) as zout:
            for info in zin.infolist():
                if not info.filename.lower().endswith(".jpg"):
                    continue
                raw = zin.read(info)
                buf = io.BytesIO()
                Image.open(io.BytesIO(raw)).convert("RGB").save(buf, "JPEG", quality=quality, subsampling=2)
                zout.writestr(info.filename, buf.getvalue())
                stats["images"] += 1
                stats["bytes_before"] += len(raw)
                stats["bytes_after"] += len(buf.getvalue())

    atomic_write(dst, write)
    n = max(stats["images"], 1)
    return {"images": stats["images"], "mean_bytes_before": stats["bytes_before"] / n,
            "mean_bytes_after": stats["bytes_after"] / n}


def degraded(data: Path, cache: Path, quality: int) -> Path:
    """``cache/qQ`` with both splits of ``data`` re-encoded at ``quality`` (made once)."""
    out = cache / f"q{quality}"
    for split in ("train", "test"):
        if not (out / f"{split}.zip").is_file():
            reencode_zip(data / f"{split}.zip", out / f"{split}.zip", quality)
    return out


def final_accuracy(run_dir: Path) -> dict[str, Any]:
    """The last evaluated test accuracy (and with TTA) of a finished ``vitlab train`` run folder."""
    history = read_history(run_dir)
    cfg = json.loads((run_dir / "train_config.json").read_text())
    if not history or history[-1]["epoch"] < cfg["epochs"]:
        raise ValueError(f"{run_dir} has not finished ({len(history)} of {cfg['epochs']} epochs): resume it first")
    last = next(h for h in reversed(history) if h.get("test_accuracy") is not None)
    return {"epochs": cfg["epochs"], "test_accuracy": last["test_accuracy"],
            "test_accuracy_tta": last.get("test_accuracy_tta"),
            "hours": round(run_hours(history), 3)}


def drops_per_doubling(steps: list[float], accuracy: list[float]) -> list[float]:
    """Accuracy lost per doubling of the quantisation step between consecutive rows, ordered by step: (a_i - a_j)
    / log2(s_j / s_i). A curve that keeps its drop per doubling down to the shared files (no flattening) says their
    own quantisation sits on the steep part; how much the step below them would win cannot be read off without the
    originals (the curve must flatten somewhere before lossless)."""
    pts = sorted(zip(steps, accuracy))
    if len({s for s, _ in pts}) != len(pts) or any(s <= 0 for s, _ in pts):
        raise ValueError(f"quantisation steps must be distinct and positive, got {sorted(steps)}")
    return [(a - b) / math.log2(t / s) for (s, a), (t, b) in zip(pts, pts[1:])]


def figure(res: dict[str, Any]):
    import plotly.graph_objects as go

    rows = res["rows"]
    fig = go.Figure()
    for key, name in (("test_accuracy", "test accuracy"), ("test_accuracy_tta", "with TTA")):
        have = [r for r in rows if r.get(key) is not None]  # a run without TTA has no point on that curve
        fig.add_trace(go.Scatter(x=[r["step"] for r in have], y=[100 * r[key] for r in have], mode="lines+markers",
                                 name=name, text=[f"quality {r['quality']}" for r in have],
                                 hovertemplate="%{text}: %{y:.2f}%"))
    fig.update_layout(title=f"{res['preset']} on CIFAR-10 JPEGs: test accuracy against the quantisation step<br>"
                            f"<sup>step relative to the shared files (IJG quality {res['shared_quality']}, 4:2:0); "
                            "each doubling is one quality step down</sup>",
                      xaxis_title="quantisation step (shared files = 1; log scale)", xaxis_type="log",
                      xaxis_tickvals=[r["step"] for r in rows],
                      xaxis_ticktext=[f"{r['step']:g} (quality {r['quality']})" for r in rows],
                      yaxis_title="test accuracy (%)",
                      template="plotly_white", width=820, height=480)
    return fig


def format_table(res: dict[str, Any]) -> str:
    lines = ["| JPEG quality | images as | mean bytes per image | test accuracy | with TTA | vs. the shared files |",
             "|---|---|---|---|---|---|"]
    base = res["rows"][0]
    for r in res["rows"]:
        tta = f"{r['test_accuracy_tta']:.2%}" if r.get("test_accuracy_tta") is not None else "-"
        delta = r["test_accuracy"] - base["test_accuracy"]
        lines.append(f"| {r['quality']} | {r['source']} | {r['mean_bytes']:.0f} | {r['test_accuracy']:.2%} | {tta} | "
                     f"{delta * 100:+.2f} points |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--qualities", type=int, nargs="+", default=[50, 25])
    ap.add_argument("--preset", default="resnet_cifar10_fast")
    ap.add_argument("--data", type=Path, default=SHARED)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "vitlab" / "jpeg")
    ap.add_argument("--runs", type=Path, default=Path.home() / ".cache" / "vitlab" / "runs")
    ap.add_argument("--out", type=Path, default=RESULTS / "jpeg_quality.json")
    args = ap.parse_args(argv)
    if not (args.data / "train.zip").is_file() or not (args.data / "test.zip").is_file():
        print(f"error: {args.data} has no train.zip and test.zip: pass --data, the folder of the shared CIFAR-10",
              file=sys.stderr)
        return 2
    bad = [q for q in args.qualities if not 1 <= q <= 99]
    if bad:
        print(f"error: JPEG qualities are 1-99 here (100 has no quantisation step to double), got {bad}",
              file=sys.stderr)
        return 2
    if len(set(args.qualities)) != len(args.qualities):
        print(f"error: --qualities names a quality twice: {args.qualities}", file=sys.stderr)
        return 2
    from vitlab.cli import main as vitlab

    with zipfile.ZipFile(args.data / "test.zip") as z:
        own = jpeg_quality(z.read(next(n for n in z.namelist() if n.lower().endswith(".jpg"))))
    if own is None:
        print(f"error: {args.data}'s JPEGs do not use the IJG tables scaled by a quality, so their quantisation step "
              "cannot be placed on the curve", file=sys.stderr)
        return 2
    if own in args.qualities:
        print(f"error: the shared files are quality {own} already (the first row): leave {own} out of --qualities",
              file=sys.stderr)
        return 2
    jobs = [(own, "shared", None)] + [(q, "re-encoded", degraded(args.data, args.cache, q)) for q in args.qualities]
    rows = []
    for q, source, folder in jobs:
        run = args.runs / f"jpeg_{args.preset}_q{q}"  # one folder per preset: never another preset's accuracy
        cmd = ["train", "--preset", args.preset, "--run-dir", str(run)]
        cmd += ["--set", f"data={folder}"] if folder else ["--set", f"data=cifar10:{args.data}"]
        if (run / "checkpoint" / "config.json").is_file():
            cmd.append("--resume")
        if _unfinished(run) and vitlab(cmd) != 0:
            return 1
        with zipfile.ZipFile((folder or args.data) / "test.zip") as z:
            sizes = [i.file_size for i in z.infolist() if i.filename.lower().endswith(".jpg")]
        rows.append({"quality": q, "source": source, "mean_bytes": sum(sizes) / len(sizes), "run_dir": run.name,
                     **final_accuracy(run)})
    for r in rows:  # IJG tables scale by 50/q below quality 50 and by (100 - q)/50 above it
        r["step"] = _scale(r["quality"]) / _scale(own)
    res = {"preset": args.preset, "shared_quality": own, "rows": rows}
    res["drops_per_doubling"] = drops_per_doubling([r["step"] for r in rows], [r["test_accuracy"] for r in rows])
    from vitlab.figures.static import write_images

    res["figure"] = write_images([figure(res)], [args.out.with_suffix(".png")], scale=2)
    text = format_table(res)
    if res["drops_per_doubling"]:
        text += ("\n\nPoints lost per doubling of the quantisation step, from the shared files down: "
                 + ", ".join(f"{100 * d:.2f}" for d in res["drops_per_doubling"]) + ".")
    return report(res, text, args.out)


def _scale(quality: int) -> float:
    """The IJG scale of the base tables at ``quality`` (libjpeg's jpeg_quality_scaling), before rounding."""
    return 5000 / quality if quality < 50 else 200 - 2 * quality


def _unfinished(run: Path) -> bool:
    try:
        final_accuracy(run)
        return False
    except (ValueError, FileNotFoundError, StopIteration, KeyError):
        return True


if __name__ == "__main__":
    raise SystemExit(main())
