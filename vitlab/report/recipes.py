"""The report's section on training recipes, and the verdicts of several runs of one recipe.

``recipes_sections``: when shipped recipe folders (``data/checkpoints/recipes/NAME/seed<n>``, written by
``vitlab export-recipe``) hold at least two recipes, the Fig. 7 verdicts of each recipe over its seeds on the same
images (``recipe_judgement``: each seed judged as the report judges its model, the seeds combined by
``vitlab.findings.recipe.combine_runs``), the table of which findings hold in which recipe
(``vitlab.findings.recipe.compare_recipes``), the seeds' test accuracies (measured once, on export) with an interval
over seeds, and the emergence of the Fig. 7 statistics over training (the cards' ``emergence`` records, one band per
recipe). Without them: no section, only a note on what is missing and the command that makes it.

``recipe_verdicts`` and ``other_runs`` are also ``vitlab reproduce --model A --model B``'s: several runs of one
recipe given as the report's model.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
from tqdm.auto import tqdm

from vitlab.base.intervals import n_units
from vitlab.base.provenance import versions
from vitlab.data.images import default_data_words, default_images, default_labels, default_source, head_class_names
from vitlab.figures.plots import emergence_curves, table_figure
from vitlab.findings.recipe import (
    RECIPE_COMMAND,
    emergence_lines,
    emergence_summary,
    recipe_accuracy,
    recipe_cards,
    shipped_recipes,
)
from vitlab.findings.verdict import Verdict
from vitlab.models.card import random_weights
from vitlab.models.info import AnyModel, ModelInfo, ResolvedModel, data_config, resolve_model
from vitlab.models.load import load_model
from vitlab.report import sections as S

__all__ = ["recipe_judgement", "recipes_sections", "recipe_verdicts",
           "other_runs", "run_labels"]

#: the section's slug, and the note's when there is no section
SLUG = "recipes"


def run_labels(runs: Sequence[Any]) -> list[str]:
    """Short names for several runs' models that still tell them apart: the fewest last parts of their paths that
    do ("s0", "s1"; "r0/checkpoint" for training run folders), else the specs as given."""
    parts = [Path(os.fspath(r)).parts if isinstance(r, (str, os.PathLike)) else () for r in runs]
    for k in range(1, max((len(p) for p in parts), default=0) + 1):
        names = ["/".join(p[-k:]) for p in parts]
        if all(parts) and len(set(names)) == len(names):
            return names
    return [str(r) for r in runs]


def other_runs(runs: Sequence[Any], net: AnyModel, info: ModelInfo, pretrained: bool, device: Any
               ) -> list[ResolvedModel]:
    """The models of ``runs[1:]`` (several training runs of one recipe), loaded on ``device``, resolved and checked
    against the first run's ``net``: the same shape (``ModelInfo``) and preprocessing, else ``ValueError`` naming
    what differs."""
    out = []
    for spec in runs[1:]:
        other = resolve_model(load_model(spec, pretrained=pretrained).to(device))
        try:
            other_info = other.info()
        except TypeError as e:
            raise ValueError(f"{spec} cannot be inspected ({e}): it is no run of the recipe of {runs[0]}") from e
        differ = [k for k in info.__dict__ if getattr(other_info, k) != getattr(info, k)]
        if differ:
            raise ValueError(f"{spec} is not a run of the same recipe as {runs[0]}: its {', '.join(differ)} differ "
                             f"({'; '.join(f'{getattr(other_info, k)!r} against {getattr(info, k)!r}' for k in differ)})"
                             "; a recipe's runs are models of one shape")
        if data_config(other) != data_config(net):
            raise ValueError(f"{spec} preprocesses its images otherwise than {runs[0]} ({data_config(other)} against "
                             f"{data_config(net)}): the runs of one recipe are shown the same images")
        out.append(other)
    return out


def recipe_verdicts(sections: list[S.Section], inp: S.Inputs, runs: Sequence[Any], others: Sequence[Any],
                    pretrained: bool, progress: bool | None = None) -> None:
    """Replace the verdicts measured on the first run (``inp``: its sections' filters, positions and distance
    verdicts) by those of the recipe: each other run (``others``, the models of ``runs[1:]``, ``other_runs``) is
    shown the same images (``inp.x``) and judged the same way, and each finding's verdicts on all runs are combined
    by ``vitlab.findings.recipe.combine_runs`` (each run's numbers in the verdict's ``details["runs"]``; the image error
    shared by the runs for the distance section's, not for the weights' own). Runs that judge
    different findings are refused (``ValueError``)."""
    from vitlab.findings.recipe import combine_runs

    labels = run_labels(runs)
    # the sections whose verdicts are measured on the model: on the images every run is shown (their sampling error
    # is shared by the runs), or on each run's own weights (filters, position embeddings: errors of its own)
    judged = {"filters": False, "positions": False, "distance": True}
    per_run: list[dict[str, list[Verdict]]] = [{s.slug: s.verdicts for s in sections if s.slug in judged}]
    for spec, label, net in tqdm(list(zip(runs[1:], labels[1:], others)), desc="other runs",
                                 disable=progress is False):
        other = replace(inp, net=net, name=label, untrained=random_weights(net.module, spec, pretrained, None))
        pred = S.prediction_pass(other)
        made = [S.filters(other), *S.positions(other), S.distance(other, pred)]
        per_run.append({s.slug: s.verdicts for s in made if s.slug in judged})
    recipe = f"{n_units(len(runs), 'runs')} ({', '.join(labels)})"
    for s in sections:
        if s.slug not in per_run[0]:
            continue
        found = [[v.finding for v in r.get(s.slug, [])] for r in per_run]
        if any(f != found[0] for f in found):
            raise ValueError(f"the runs judge different findings in the {s.slug} section ({found}): they are no "
                             "runs of one recipe")
        combined = []
        for i, v0 in enumerate(s.verdicts):
            rest = v0.subject.removeprefix(inp.name)  # " on 128 CIFAR-10 test images", ", weights alone"
            each = [replace(v0, subject=labels[0] + rest)] + [r[s.slug][i] for r in per_run[1:]]
            combined.append(combine_runs(each, subject=recipe + rest, shared=judged[s.slug]))
        s.verdicts = combined


def recipe_judgement(runs: Sequence[Path], device: Any = "cpu", name: str | None = None) -> list[Verdict]:
    """The Fig. 7 verdicts (filters, position embeddings, attention distance) of the recipe whose seeds are the
    checkpoints ``runs``, each seed judged on its default images (for 32 px models the 128 shipped CIFAR-10 test
    images, the same for every seed) and combined over the seeds (``recipe_verdicts``); ``name``: the recipe, leading
    each verdict's subject. Raises ValueError for runs of different shapes or preprocessing."""
    runs = [str(r) for r in runs]
    rm = resolve_model(load_model(runs[0]).to(device).eval())
    net, info = rm.module, rm.info()
    others = other_runs(runs, rm, info, True, device)
    names, x, shown = default_images(net)
    labels, _ = default_labels(net, len(names))
    base = {"model": runs[0], "weights": runs[0], "versions": versions(), "images": default_source(net)}
    inp = S.Inputs(rm, info, names, x.to(device), shown, base, labels, head_class_names(net),
                   source=default_source(net), name=run_labels(runs)[0], data=default_data_words(net, len(names)))
    pred = S.prediction_pass(inp)
    sections = [S.filters(inp), *S.positions(inp), S.distance(inp, pred)]
    recipe_verdicts(sections, inp, runs, others, True, progress=False)
    lead = f"{name}: " if name else ""
    return [replace(v, subject=lead + (v.subject or "")) for s in sections for v in s.verdicts]


def _holds_words(row: dict, names: Sequence[str]) -> str:
    """Where a ``compare_recipes`` row's finding holds; "in neither" (or "in none") only where every recipe judged
    it not reproduced, never where one of them could not decide."""
    held, undecided = row["holds_in"], row["undecided_in"]
    if len(held) == len(names):
        return "in every recipe"
    if len(undecided) == len(names):
        return "undecided in every recipe"
    where = ("only in " + ", ".join(held)) if held else ("in neither" if len(names) == 2 else "in none")
    return where + (f"; undecided in {', '.join(undecided)}" if undecided else "")


def _accuracy_rows(cards: dict[str, list[dict]]) -> tuple[list[list], dict[str, Any]]:
    """The test-accuracy table (one row per recipe: seeds, mean, 95% interval over seeds, each seed's) and its
    numbers (``recipe_accuracy``) for metrics."""
    numbers = recipe_accuracy(cards)
    rows = []
    for name, v in numbers.items():
        lo, hi = v["interval"]
        interval = f"[{lo:.2%}, {hi:.2%}]" if np.isfinite(lo) else "none (why: below)"
        rows.append([name, len(v["test_accuracy"]), f"{v['mean']:.2%}" if v["mean"] is not None else "-", interval,
                     ", ".join(f"{a:.2%}" for a in v["test_accuracy"])])
    return rows, numbers

def recipes_sections(root: Path, device: Any = "cpu", tick: Callable[[str], None] | None = None) -> list[S.Section]:
    """The report's recipe sections (the module docstring) from the shipped recipes under ``root``; with fewer than
    two, one hidden section that only notes what is missing and the command that makes it."""
    tick = tick or (lambda what: None)
    found = shipped_recipes(root)
    if len(found) < 2:
        have = f": {', '.join(found)}" if found else ""
        why = (f"{n_units(len(found), 'shipped recipes')} in {root}{have}; the comparison needs two. Make them: "
               f"{RECIPE_COMMAND}")
        return [S.Section(SLUG, "Training recipes", None, "", "", {}, hidden=True,
                          not_judged=[("Fig. 7 findings by training recipe", why)])]
    judged: dict[str, list[Verdict]] = {}
    for name, seeds in found.items():
        tick(f"judging {name}")
        judged[name] = recipe_judgement(seeds, device, name)
    from vitlab.findings.recipe import compare_recipes

    rows = compare_recipes(judged)
    names = list(found)
    cards = {name: recipe_cards(seeds) for name, seeds in found.items()}
    teachers = {n: cs[0].get("teacher") for n, cs in cards.items()}
    holds = [_holds_words(r, names) for r in rows]
    table = table_figure(["finding (its key; named in the verdicts below)", *names, "holds"],
                         [[r["key"], *(r["outcomes"][n] for n in names), w]  # qualifiers: in the verdicts' lines
                          for r, w in zip(rows, holds)],
                         "Fig. 7 findings by recipe (each judged over its seeds on the same images)")
    counts = Counter(holds)
    stamp = {"model": ", ".join(f"{n} ({n_units(len(s), 'seeds')})" for n, s in found.items()), "weights": str(root),
             "versions": versions(), "images": "each recipe's default images (the same for every seed)",
             "settings": {"teachers": {n: t or "none" for n, t in teachers.items()}}}
    compare = S.Section(
        SLUG, "Training recipes: which Fig. 7 findings hold with and without a teacher", table,
        "The paper's ViTs were trained without a teacher; DeiT reports that a CNN teacher passes some of its inductive "
        "bias to the student.",
        f"{len(rows)} findings judged in {len(names)} recipes ("
        + "; ".join(f"{n}: {n_units(len(found[n]), 'seeds')}, teacher {teachers[n] or 'none'}" for n in names)
        + "): " + "; ".join(f"{k} {w}" for w, k in counts.items()) + ".",
        stamp, [v for vs in judged.values() for v in vs],
        metrics={"rows": rows, "teachers": teachers, "seeds": {n: [s.name for s in found[n]] for n in names}})
    return [compare, *_accuracy_and_emergence(cards, stamp, tick)]


def _accuracy_and_emergence(cards: dict[str, list[dict]], stamp: dict, tick: Callable[[str], None]
                            ) -> list[S.Section]:
    tick("accuracy and emergence")
    rows, numbers = _accuracy_rows(cards)
    accuracy = S.Section(
        "recipe_accuracy", "Training recipes: test accuracy over seeds",
        table_figure(["recipe", "seeds", "mean", "95% interval over seeds", "each seed"], rows,
                     "Test accuracy, measured once on export from the fp16 weights"),
        "Published no-teacher results for ViT-Lite-7/4 on CIFAR-10 are about 91% after 300 epochs.",
        "; ".join(f"{n}: {v['mean']:.2%} over {n_units(len(v['test_accuracy']), 'seeds')} ({v['method']}), "
                  f"{v['epochs']} epochs" + (" (a shortened schedule)" if v["shortened"] else "")
                  for n, v in numbers.items() if v["mean"] is not None) + ".",
        stamp, metrics=numbers)
    bands, times, missing = emergence_summary(cards)
    if not bands:
        return [accuracy]
    emergence = S.Section(
        "emergence", "Training recipes: the Fig. 7 statistics as they emerge", emergence_curves(
            bands, title="Fig. 7 statistics during training: mean over seeds, band min to max"),
        "The paper shows the trained model only; when its findings appear during training is not reported.",
        " ".join(emergence_lines(times)) + (f" No emergence records for {', '.join(missing)}." if missing else ""),
        stamp, metrics={"halfway": times, "bands": bands},
        not_judged=[(f"emergence of {n}", "its cards hold no emergence records: export its runs again with "
                     + RECIPE_COMMAND) for n in missing])
    return [accuracy, emergence]
