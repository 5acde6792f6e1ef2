"""``vitlab reproduce``: run every inspection experiment on a model and write a self-contained report.

One builder per paper figure (``vitlab.report.sections``) returns a section with its figure, the paper's
statement, ours (formatted from the numbers), a provenance stamp and the verdicts of ``vitlab.findings.model`` (the
scaling section's of ``vitlab.findings.studies``);
``vitlab.report.render`` turns the sections into HTML through a Jinja2 template. Everything is written into a
temporary folder beside ``out`` and moved into place at the end, so a failed run leaves ``out`` as it was.
Nothing else in vitlab imports this package (it is a leaf).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tqdm.auto import tqdm

from vitlab.base.atomic import refuse_foreign_dir, replace_dir, temp_dir_beside
from vitlab.base.checks import check_int
from vitlab.base.devices import resolve_device
from vitlab.base.errors import FolderError, ParameterError, Placeholder, Setting
from vitlab.base.intervals import n_units
from vitlab.base.provenance import VERSION, versions
from vitlab.data.images import (
    default_data_words,
    default_image_count,
    default_images,
    default_labels,
    default_source,
    head_class_names,
    load_images,
)
from vitlab.figures.static import write_images
from vitlab.findings.controls import validation_table
from vitlab.findings.judge import model_label
from vitlab.findings.verdict import json_types
from vitlab.models.card import model_facts, random_weights, weights_description
from vitlab.models.checkpoint import model_card
from vitlab.models.info import ModelInfo, ResolvedModel, has_attention, resolve_model
from vitlab.models.load import load_model
from vitlab.report import sections as S
from vitlab.report.recipes import other_runs, recipe_verdicts, run_labels
from vitlab.report.render import render_html, stamp_line
from vitlab.report.steps import SCALING_RESULTS, Context, Step, chosen

__all__ = ["reproduce", "write_report", "check_report_dir", "report_target", "not_a_report", "report_entries",
           "SCALING_RESULTS"]

IMAGE_FORMATS = ("png", "svg", "pdf", "jpg", "webp")


def _summary(net, info, model: str | None, pretrained: bool, weights: str | None, images: str,
             n_images: int) -> dict[str, Any]:
    card = model_card(net)
    params = sum(p.numel() for p in net.parameters())
    cfg = getattr(net, "vitlab_config", None)
    facts = [*model_facts(net, info, model, pretrained, weights), ("images", f"{n_images} of {images}")]
    headline = ("The findings of Dosovitskiy et al., \"An Image is Worth 16x16 Words\" (ICLR 2021), judged on the "
                "subject each row names: the model below and its images, the shipped shapes ViT or the shipped "
                "studies. Each verdict comes from a stated criterion and a 95% interval; grey means the data cannot "
                "decide.")
    return {"model": str(model or "embedded default"), "headline": headline, "facts": facts,
            "config": type(cfg).__name__ if cfg is not None else None, "parameters": params,
            "card_accuracy": card.get("test_accuracy") if card else None, "vitlab": VERSION}


def check_report_dir(out: Path) -> None:
    """Refuse an ``out`` that ``reproduce`` must not replace: a file, or a non-empty folder that is not an earlier
    report. The report replaces the whole folder, so anything else in it would be deleted: an earlier report's
    folder holds only what the report writes (``report_entries``) and a ``metrics.json`` that the report wrote."""
    problem = not_a_report(out) if out.is_dir() and any(out.iterdir()) else None
    if problem is not None:
        raise FolderError("out", str(out), problem=f"holds no earlier report: {problem}. vitlab reproduce replaces "
                          "the whole folder and would delete them", fix=[Setting("out", Placeholder("NEW_OR_EMPTY_FOLDER"))])
    refuse_foreign_dir(out, lambda d: True, "vitlab reproduce", "earlier report", "out")  # a file


def report_target(out: str | os.PathLike) -> Path:
    """``out`` as an absolute path ('.' and '..' resolved, links kept), refused when it is the current folder or
    one above it: the report replaces its folder as a whole, which would pull the folder out from under the
    shell it runs in (and ``Path('.').name`` is empty, so the temporary folder beside it had no name)."""
    target = Path(os.path.abspath(out))
    here = Path(os.path.abspath(os.curdir))
    if target == here or target in here.parents:
        raise ParameterError("out", str(out), problem=f"the current folder or one that holds it ({target}); vitlab "
                             "reproduce replaces its folder as a whole", fix=[Setting("out", str(Path(out) / "report"))])
    return target


def report_entries(metrics: dict[str, Any]) -> set[str]:
    """The names ``write_report`` gives the entries of a report's folder, given its ``metrics.json``:
    report.html, metrics.json and each figure as ``{slug}.{format}``."""
    slugs = [f.get("slug") for f in metrics.get("figures", []) if isinstance(f, dict)]
    return {"report.html", "metrics.json"} | {f"{slug}.{fmt}" for slug in slugs if slug for fmt in IMAGE_FORMATS}


def not_a_report(folder: Path) -> str | None:
    """Why ``folder`` is not an earlier report's (its metrics.json is missing, unreadable or not the report's;
    entries the report does not write, named), None when it is one."""
    problems, metrics = [], {}
    try:
        metrics = json.loads((folder / "metrics.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        problems.append("no metrics.json")
    except (OSError, ValueError) as e:
        problems.append(f"its metrics.json does not parse ({type(e).__name__}: {e})")
    else:
        if not (isinstance(metrics, dict) and isinstance(metrics.get("summary"), dict) and "vitlab" in
                metrics["summary"] and isinstance(metrics.get("verdicts"), list)
                and isinstance(metrics.get("figures"), list)):
            problems.append("its metrics.json is not a report's (no summary.vitlab, verdicts and figures)")
            metrics = {}
    if not (folder / "report.html").is_file():
        problems.append("no report.html")
    ours = report_entries(metrics)
    other = sorted(p.name + ("/" if p.is_dir() else "") for p in folder.iterdir()
                   if p.name not in ours or not p.is_file())
    if other:
        shown = ", ".join(other[:10]) + (f" and {len(other) - 10} more" if len(other) > 10 else "")
        problems.append(f"the report does not write {shown}")
    return "; ".join(problems) or None


def metrics_json(metrics: dict[str, Any]) -> str:
    """``metrics`` as strict JSON text: numpy and torch numbers, arrays and tensors as JSON numbers and lists, NaN
    and infinities as null (``vitlab.findings.verdict.json_types``). Any other type is refused by its place in ``metrics``
    rather than written as its ``str()``, which a reader could not tell from a real string."""
    plain = json_types(metrics)
    where = _not_json(plain, "metrics")
    if where is not None:
        raise TypeError(f"{where} is not a JSON value: convert it to numbers, strings or lists where the report's "
                        "metrics are made (vitlab.report)")
    return json.dumps(plain, indent=2, allow_nan=False) + "\n"


def _not_json(x: Any, where: str) -> str | None:
    """The place and type of the first value in ``x`` that is not a JSON type, None when there is none."""
    if isinstance(x, dict):
        return next((w for k, v in x.items() if (w := _not_json(v, f"{where}[{k!r}]")) is not None), None)
    if isinstance(x, list):
        return next((w for i, v in enumerate(x) if (w := _not_json(v, f"{where}[{i}]")) is not None), None)
    return None if x is None or isinstance(x, (str, int, float, bool)) else f"{where} ({type(x).__name__})"


def reproduce(model: str | None = None, images: str | None = None, out: str | os.PathLike = "out",
              pretrained: bool = True, num_images: int | None = None, shapes: bool = True, png: bool = True,
              progress: bool | None = None, weights: str | None = None, few_shot: bool = True,
              scaling: bool = True, image_scale: float = 1.0, formats: Sequence[str] = ("png",),
              skip_bad: bool = False, device: str | None = None, recipes: bool = True) -> Path:
    """Write ``report.html``, ``metrics.json`` (and static figures when a Chromium is found) into ``out``.

    ``model``: anything ``load_model`` takes (default: the embedded checkpoint), ``weights`` a local weights file
    for it; a list of checkpoint folders or timm names: several training runs of one recipe, whose verdicts are
    combined. ``images``: a folder (default: for 32 px models the 128 shipped CIFAR-10 test images, otherwise crops
    of scikit-learn's photos), ``num_images`` of them. ``shapes``: the localisation table of the shipped shapes
    ViT; ``few_shot``: the few-shot probe on CIFAR-10 when it is readable; ``scaling``: the shipped sweep;
    ``recipes``: the shipped training recipes compared (``vitlab.report.recipes``).
    ``formats`` and ``image_scale``: static figures (e.g. ``("png", "svg")``, 2.0 for high resolution);
    ``skip_bad``: skip unreadable or too small images of ``images`` with a warning instead of failing.
    ``device``: where the model and the analyses run (``vitlab.base.devices.resolve_device``: default CUDA when
    available); the figures and numbers are computed the same way on either, up to floating-point rounding.
    The sections are ``vitlab.report.steps.STEPS``, in their order.

    Raises ``ValueError``/``TypeError`` for bad arguments before any work; ``out`` is left as it was on failure.
    """
    t0 = time.time()
    runs = list(model) if isinstance(model, (list, tuple)) else [model]
    _check_arguments(runs, weights, formats, num_images, image_scale)
    out = report_target(out)
    dev = resolve_device(device)
    check_report_dir(out)  # before any work: the report replaces the whole folder
    rm, info = _load(runs[0], pretrained, weights, dev)  # resolved here, once: the sections are handed rm
    others = other_runs(runs, rm, info, pretrained, dev)  # before any work: runs of another shape are refused
    inp, summary = _inputs(rm, info, runs[0], pretrained, weights, images, num_images, skip_bad, dev)
    ctx = Context(inp, dev, {"shapes": shapes, "few_shot": few_shot, "scaling": scaling, "recipes": recipes})
    sections, step_seconds = run_steps(ctx, chosen(ctx.options), progress)
    if len(runs) > 1:  # the verdicts measured on each run's weights and images, combined into the recipe's
        t = time.time()
        recipe_verdicts(sections, inp, runs, others, pretrained, progress)
        step_seconds["other runs"] = round(time.time() - t, 2)
        summary["facts"].append(("runs", f"{len(runs)} training runs of one recipe ({', '.join(run_labels(runs))}): "
                                 "the figures and numbers of each section are the first run's; the verdicts measured "
                                 "on the model combine all of them (vitlab.findings.recipe)"))
    summary["seconds"] = round(time.time() - t0, 1)  # before metrics copies the summary: both carry it
    metrics = report_metrics(inp, summary, runs, ctx.pred, step_seconds, sections)
    figures = {s.slug: s.figure for s in sections if s.figure is not None} if png else None
    write_report(out, render_html(summary, sections), metrics, figures, formats, image_scale, t0)
    return out


def _check_arguments(runs: list, weights: str | None, formats: Sequence[str], num_images: int | None,
                     image_scale: float) -> None:
    """``reproduce``'s arguments that can be refused before any work (``ValueError``, ``TypeError``)."""
    if not runs or (len(runs) > 1 and (weights or any(m is None or not isinstance(m, (str, os.PathLike))
                                                      for m in runs))):
        raise ParameterError("model", runs, "one model, or a list of checkpoint folders or timm names (at least "
                             "one) without weights", problem="not one model or several runs of a recipe")
    if isinstance(formats, str):  # its letters were read as formats ("unknown figure format(s) ['g', 'n', 'p']")
        raise TypeError(f"formats must be a list of figure formats, got the string {formats!r}: pass [{formats!r}]")
    check_int("num_images", num_images, 1, allowed="a whole number of at least 1, or None for the default", none=True)
    if not (isinstance(image_scale, (int, float)) and math.isfinite(image_scale) and image_scale > 0):
        raise ValueError(f"image_scale must be a positive number (2.0: twice the resolution), got {image_scale!r}")
    bad = sorted(set(formats) - set(IMAGE_FORMATS))
    if bad:
        raise ValueError(f"unknown figure format(s) {bad}: choose from {list(IMAGE_FORMATS)}")


def _load(model: Any, pretrained: bool, weights: str | None, dev: Any) -> tuple[ResolvedModel, ModelInfo]:
    """The model on ``dev``, resolved once for every section (``ResolvedModel``), and its ``ModelInfo``;
    ``ValueError`` for a model vitlab cannot inspect."""
    net = load_model(model, pretrained=pretrained, weights=weights).to(dev)
    rm = resolve_model(net)
    try:
        return rm, rm.info()  # a model without attention fails here, before any work
    except TypeError as e:
        what = "cannot be inspected" if has_attention(net) else "has no self-attention to inspect"
        raise ValueError(f"{model or 'this model'} {what} ({e}). `vitlab reproduce` needs a ViT-family model that "
                         "vitlab reads: a timm ViT/DeiT name or a vitlab ViT or hybrid checkpoint") from e


def _inputs(rm: ResolvedModel, info: ModelInfo, model: Any, pretrained: bool, weights: str | None, images: str | None,
            num_images: int | None, skip_bad: bool, dev: Any) -> tuple[S.Inputs, dict[str, Any]]:
    """The builders' ``Inputs`` (the resolved model ``rm``, its images preprocessed on ``dev``, their labels when
    known) and the report's summary."""
    net = rm.module
    if images:
        names, x, shown = load_images(net, images, limit=num_images or 16, skip_bad=skip_bad)
        labels, source = None, str(images)
    else:
        most = default_image_count(net)
        if num_images is not None and num_images > most:  # default_images' own error named its argument n
            raise ParameterError("num_images", num_images, f"at most {most}", problem=f"this model's default images "
                                 f"are {default_source(net)}", fix=[Setting("num_images", most),
                                                                    Setting("images", Placeholder("FOLDER"))])
        names, x, shown = default_images(net, num_images)
        labels, _ = default_labels(net, len(names))  # the CIFAR sample's true classes (named by Inputs)
        source = default_source(net)
    classes = head_class_names(net)  # the model's own class names where its checkpoint records them, else "class k"
    wdesc = weights_description(net, model, pretrained, weights)
    base = {"model": str(model or "embedded default"), "weights": wdesc, "versions": versions(),
            "images": f"{len(names)} of {source}"}
    data = f"{n_units(len(names), 'images')} of {images}" if images else default_data_words(net, len(names))
    inp = S.Inputs(rm, info, names, x.to(dev), shown, base, labels, classes,
                   untrained=random_weights(net, model, pretrained, weights), source=source,
                   name=model_label(net, model), data=data)
    return inp, _summary(net, info, model, pretrained, weights, source, len(names))


def run_steps(ctx: Context, steps: Sequence[Step], progress: bool | None = None
              ) -> tuple[list[S.Section], dict[str, float]]:
    """Run ``steps`` in order on ``ctx``: the sections they made, and each step's seconds by name. One progress bar
    counts parts: a long step says when each of its parts begins (a map method, a split's features), so the bar
    moves within it and names what runs."""
    bar = tqdm(total=sum(s.parts for s in steps), desc="reproduce", unit="part", disable=progress is False)
    sections: list[S.Section] = []
    seconds: dict[str, float] = {}
    for step in steps:
        bar.set_postfix_str(step.name)
        t = time.time()
        counted = begun = 0

        def tick(what: str, step: Step = step) -> None:  # a part begins, so the one before it is done
            nonlocal counted, begun
            if begun and counted < step.parts - 1:  # never past the step's parts
                bar.update()
                counted += 1
            begun += 1
            bar.set_postfix_str(f"{step.name}: {what}")

        made = step.build(ctx, tick)
        seconds[step.name] = round(time.time() - t, 2)
        sections += [made] if isinstance(made, S.Section) else list(made or [])
        bar.update(step.parts - counted)
    bar.close()
    return sections, seconds


def report_metrics(inp: S.Inputs, summary: dict[str, Any], runs: Sequence[Any], pred: dict[str, Any],
                   step_seconds: dict[str, float], sections: Sequence[S.Section]) -> dict[str, Any]:
    """``metrics.json``'s content: the stamp, the summary, the predictions, every section's numbers and verdicts,
    the criterion-validation table and what could not be judged."""
    by_slug = {s.slug: s for s in sections}
    metrics: dict[str, Any] = {
        **inp.base, "summary": {k: v for k, v in summary.items() if k != "facts"} | {"facts": dict(summary["facts"])},
        "runs": [str(r or "embedded default") for r in runs],
        "model_info": {k: list(v) if isinstance(v, tuple) else v for k, v in inp.info.__dict__.items()},
        "image_names": inp.names, "attention_shape": pred["attention_shape"], "step_seconds": step_seconds,
        "predictions": [] if pred["pred"] is None else  # none without a classifier head
        [{"image": n, "class": int(c), "probability": float(p)} for n, c, p in zip(inp.names, pred["pred"], pred["prob"])],
        "verdicts": [{"section": s.slug, **v.to_dict()} for s in sections for v in s.verdicts],
        # every finding's criterion on its controls (vitlab.findings.controls): finding x control, expected, observed
        "criterion_validation": validation_table(v for s in sections for v in s.verdicts),
        "not_judged": [{"section": s.slug, "finding": what, "reason": why} for s in sections
                       for what, why in s.not_judged],
        "figures": [{"slug": s.slug, "title": s.title, "paper": s.paper, "ours": s.ours, "stamp": s.stamp,
                     "stamp_line": stamp_line(s.stamp), "metrics": s.metrics,
                     "verdicts": [v.to_dict() for v in s.verdicts]} for s in sections if not s.hidden],
        # flat keys kept for scripts that read earlier reports
        "mean_attention_distance_px": by_slug["distance"].metrics["mean_attention_distance_px"],
        "methods": by_slug["faithfulness"].metrics["methods"] if "faithfulness" in by_slug else [],
    }
    if "localisation" in by_slug:
        metrics["shapes_localisation"] = by_slug["localisation"].metrics
    return metrics


def write_report(out: Path, page: str, metrics: dict[str, Any], figures: dict[str, Any] | None,
                 formats: Sequence[str] = ("png",), image_scale: float = 1.0, t0: float | None = None) -> None:
    """Write ``report.html``, ``metrics.json`` and the static ``figures`` ({slug: figure}; None: not asked for) in
    each of ``formats`` into a temporary folder beside ``out``, then swap it into place (``replace_dir``): a failure
    leaves ``out`` as it was. ``metrics`` gains ``png`` (what was written) and ``seconds_total`` (since ``t0``)."""
    t0 = time.time() if t0 is None else t0
    tmp = temp_dir_beside(out)
    try:
        (tmp / "report.html").write_text(page, encoding="utf-8")  # plotly.js is not ASCII
        if figures is not None:
            paths = [tmp / f"{slug}.{fmt}" for fmt in formats for slug in figures]
            metrics["png"] = write_images([f for fmt in formats for f in figures.values()], paths, scale=image_scale)
        else:
            metrics["png"] = "not asked for"
        metrics["seconds_total"] = round(time.time() - t0, 2)
        (tmp / "metrics.json").write_text(metrics_json(metrics), encoding="utf-8")
        replace_dir(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
