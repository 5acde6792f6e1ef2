"""Tuning a data-scaling sweep's recipes (``tune``: each family once, on the largest subset, over ``TUNING_GRID``,
the winners frozen into the sweep's config) and reading the trials back: the README's tuning table
(``tuning_table``), which recipes the shown runs trained with (``plotted_recipes``), which trials were theirs
(``tuning_trials_for``), and where each chosen recipe sits in its grid (``recipe_grid_positions``). The sweep, its
runs and their results store are ``vitlab.studies.scaling``'s.
"""

from __future__ import annotations

import dataclasses
import math
import os
import sys
from collections.abc import Iterable, Mapping, Sequence

from tqdm.auto import tqdm

from vitlab.base.records import code_version, of_newest_code
from vitlab.base.stats import percent_cell
from vitlab.studies.scaling import ResultsStore, RunSpec, SweepConfig, check_executor, execute_runs, one_config

__all__ = ["TUNING_GRID", "tune", "plan_table", "TuningIncomplete", "tuning_table", "plotted_recipes", "tuning_trials_for",
           "recipe_grid_positions"]


#: The tuning grid per family: (optimizer, lr, weight decay), four recipes each (the same budget; a coarse grid, on
#: which a winner at an edge may be short of its family's best recipe: ``recipe_grid_positions``). For the ViT and
#: the hybrid a 2 x 2 grid of AdamW's learning rate and weight decay; for the ResNet the paper's Adam (App. D.1:
#: slightly better than SGD for its ResNets) at two learning rates against BiT's own SGD with momentum at two.
TUNING_GRID: dict[str, tuple[tuple[str, float, float], ...]] = {
    "vit": tuple(("adamw", lr, wd) for lr in (1e-3, 2e-3) for wd in (0.05, 0.2)),
    "hybrid": tuple(("adamw", lr, wd) for lr in (1e-3, 2e-3) for wd in (0.05, 0.2)),
    "bit": tuple(("adamw", lr, 0.05) for lr in (1e-3, 3e-3)) + tuple(("sgd", lr, 5e-4) for lr in (0.03, 0.1)),
}


def tune(sweep: SweepConfig, results: str | os.PathLike, grid: dict[str, Sequence[tuple[str, float, float]]] | None
         = None, progress: bool | None = None, executor: str = "local", workers: int = 0,
         address: str | None = None, work_dir: str | os.PathLike | None = None) -> SweepConfig:
    """Tune each family once, on the largest subset with seed 0, over ``grid`` (default ``TUNING_GRID``), by the best
    validation accuracy; return ``sweep`` with the winning recipes frozen in. Every trial is appended to ``results``
    (a JSONL store of its own), and finished trials are skipped when tuning is run again. Trials run like a sweep's
    runs (``executor``, ``workers``, ``address`` as in ``run_sweep``; ``workers=0``: one after another in this
    process).

    Every trial of every family's grid must finish: otherwise ``TuningIncomplete`` names the trials that failed or
    never finished and nothing is frozen (a family tuned on part of its grid, or not at all, would otherwise train
    with a recipe no complete tuning chose). Running the same tuning again runs only those trials."""
    if not sweep.val_per_class:
        raise ValueError("tuning needs a validation split: set val_per_class > 0 (never tune on the test images)")
    check_executor(executor, workers)
    grid = grid or TUNING_GRID
    store = ResultsStore(results)
    spec_of = {f: RunSpec(f, max(sweep.sizes), 0) for f in sweep.families}
    # a trial's config names its own family only: adding or removing another family leaves its fingerprint, so its
    # finished record still counts
    trials = [(f, tuple(r), dataclasses.replace(sweep, name=f"{sweep.name}-tune", families=(f,), recipes=((f, *r),),
                                                 seeds=(0,), sizes=(max(sweep.sizes),)))
              for f in sweep.families for r in grid.get(f, ((*sweep.recipe(f),),))]

    def finished() -> dict[tuple[str, str], dict]:
        """{(fingerprint, run id): record} of the trials whose latest record finished: one read of the store."""
        name = f"{sweep.name}-tune"
        latest = {(r.get("fingerprint"), r["run_id"]): r for r in store.records() if r.get("sweep") == name}
        return {k: r for k, r in latest.items() if r["status"] == "ok"}

    prints = {id(trial): trial.fingerprint() for _, _, trial in trials}  # computed here; the workers record these
    done = finished()
    todo = [(trial, spec_of[f]) for f, _, trial in trials if (prints[id(trial)], spec_of[f].run_id) not in done]
    if todo:
        store.check_writable()
    bar = tqdm(total=len(todo), desc=f"tune {sweep.name}", disable=progress is False)
    if progress is not False:
        print(f"tune {sweep.name}: {len(trials) - len(todo)} of {len(trials)} trials already done, skipped; "
              f"{len(todo)} to run", file=sys.stderr)

    def finish(rec: dict) -> None:
        store.append(rec)
        ok = rec["status"] == "ok"
        bar.set_postfix_str(f"{rec['run_id']} {rec['config']['recipes'][0][1:]}: "
                            + (f"val {rec['metrics']['best']['val_accuracy']:.3f}" if ok else "failed"))
        if not ok:
            bar.write(f"tuning {rec['run_id']} {rec['config']['recipes'][0][1:]}: failed ({rec['error']})")
        bar.update()

    try:
        execute_runs(todo, finish, executor, workers, address, work_dir)
    finally:
        bar.close()
    done = finished()
    missing = [(f, r, trial) for f, r, trial in trials if (prints[id(trial)], spec_of[f].run_id) not in done]
    if missing:
        latest = {(r.get("fingerprint"), r["run_id"]): r for r in store.records()
                  if r.get("sweep") == f"{sweep.name}-tune"}

        def why(f: str, trial: SweepConfig) -> str:
            rec = latest.get((prints[id(trial)], spec_of[f].run_id))
            return "no record (killed, or never started)" if rec is None else f"failed: {rec.get('error')}"

        lines = "\n".join(f"  {f} {opt} lr={lr:g} weight decay={wd:g}: {why(f, trial)}"
                          for f, (opt, lr, wd), trial in missing)
        raise TuningIncomplete(
            f"tuning of sweep {sweep.name!r} is incomplete: {len(missing)} of {len(trials)} trials did not finish, so "
            f"no recipe is frozen (a family tuned on part of its grid, or not at all, would train with a recipe no "
            f"complete tuning chose):\n{lines}\nFix what failed and run the same tuning again (the same --tune "
            f"command, or tune() with the results store {store.path}): the {len(trials) - len(missing)} finished "
            "trials are skipped, only these run")
    best = _winners(done[(prints[id(trial)], spec_of[family].run_id)] for family, _, trial in trials)  # grid order
    from vitlab.base import provenance as prov

    # every trial's fingerprint holds this process's code hash: the code the recipes were chosen with
    return dataclasses.replace(sweep, recipes=tuple(best[f] for f in sweep.families), tuned_code=prov.code_hash())


class TuningIncomplete(RuntimeError):
    """``tune`` ended with trials of the grid failed or not run: nothing was frozen; the message names them."""


def _winners(trials: Iterable[dict]) -> dict[str, tuple[str, str, float, float]]:
    """{family: (family, optimizer, lr, weight decay)} of each family's finished tuning trial with the highest best
    validation accuracy; of equals, the first in the order given (``tune`` gives grid order)."""
    best: dict[str, tuple[float, tuple[str, str, float, float]]] = {}
    for r in trials:
        fam = r["spec"]["family"]
        if r["status"] == "ok" and (fam not in best or r["metrics"]["best"]["val_accuracy"] > best[fam][0]):
            fam_, opt, lr, wd = r["config"]["recipes"][0]
            best[fam] = (r["metrics"]["best"]["val_accuracy"], (fam_, opt, float(lr), float(wd)))
    return {f: recipe for f, (_, recipe) in best.items()}


def tuning_table(records: Sequence[dict], shots: int = 10,
                 chosen: Sequence[tuple[str, str, float, float]] | None = None) -> str:
    """The README table of a tuning store (``tune``'s JSONL records): one row per (family, recipe) trial, families
    in the order they first appear and recipes in ``TUNING_GRID`` order, with the best validation accuracy and its
    epoch, and the ``shots``-shot probe (mean ± std over probe seeds) of that model. ``chosen``: the recipes to mark
    (those the shown runs trained with: ``plotted_recipes``; empty: none); None marks each family's highest
    validation accuracy (the first of equals in grid order, as ``tune`` picks). The latest record of a trial wins,
    among the records of the newest code version (``vitlab.base.records.of_newest_code``): a re-tuning
    after a code change never shows a trial twice or marks an old code's winner."""
    latest = {(r.get("sweep"), r["spec"]["family"], tuple(r["config"]["recipes"][0][1:]), r["run_id"]): r
              for r in of_newest_code(records)[0]}
    families = list(dict.fromkeys(r["spec"]["family"] for r in latest.values()))

    def order(r: dict) -> tuple[int, int]:
        fam, recipe = r["spec"]["family"], tuple(r["config"]["recipes"][0][1:])
        grid = [tuple(g) for g in TUNING_GRID.get(fam, ())]
        return families.index(fam), grid.index(recipe) if recipe in grid else len(grid)

    rows = sorted(latest.values(), key=order)
    marked = set(_winners(rows).values()) if chosen is None else {(f, o, float(lr), float(wd))
                                                                   for f, o, lr, wd in chosen}
    lines = [f"| family | optimizer | lr | weight decay | best val. accuracy | at epoch | {shots}-shot | chosen |",
             "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        fam, opt, lr, wd = r["config"]["recipes"][0]
        if r["status"] != "ok":
            lines.append(f"| {fam} | {opt} | {lr:g} | {wd:g} | failed | | | |")
            continue
        m = r["metrics"]
        few = m["few_shot"].get(str(shots))
        lines.append(f"| {fam} | {opt} | {lr:g} | {wd:g} | {100 * m['best']['val_accuracy']:.1f}% | "
                     f"{m['best']['epoch']} of {m['epochs']} | {percent_cell(few['per_seed']) if few else ''} | "
                     f"{'**yes**' if (fam, opt, float(lr), float(wd)) in marked else ''} |")
    return "\n".join(lines)


#: The fields ``tune`` sets in a trial's config: the rest must be the runs' own for a trial to be theirs.
_TUNING_FIELDS = ("name", "families", "recipes", "seeds", "sizes", "tuned_code")


def plotted_recipes(records: Sequence[Mapping]) -> tuple[tuple[str, str, float, float], ...]:
    """The recipes the runs of ``records`` (one sweep config: ``one_config``) trained with, from their own config;
    () for runs without tuned recipes (each family then trained with AdamW at the sweep's lr)."""
    one_config(records)
    if not records:
        return ()
    return tuple((f, o, float(lr), float(wd)) for f, o, lr, wd in (records[0].get("config") or {}).get("recipes", ()))


def tuning_trials_for(records: Sequence[Mapping], trials: Sequence[dict]) -> tuple[list[dict], str]:
    """The tuning trials (``tune``'s records) behind the runs of ``records`` (one sweep config), and a sentence
    saying which and how many were kept: trials of that sweep's tuning (sweep ``NAME-tune``) whose config is the
    runs' own but for what tuning sets (one family and recipe, seed 0, the largest subset), made by the code the
    recipes were tuned with (the runs' ``tuned_code``; for a config that predates it, the runs' own code). Trials of
    another config or code (a later re-tuning the runs never used) are left out."""
    one_config(records)
    if not records:
        return [], "no runs to match tuning trials to"
    cfg = records[0].get("config") or {}
    code = cfg.get("tuned_code") or code_version(records[0])
    name = f"{cfg.get('name')}-tune"
    same = lambda t: all(t.get(k) == cfg.get(k) for k in set(t) | set(cfg) if k not in _TUNING_FIELDS)  # noqa: E731
    kept = [t for t in trials if t.get("sweep") == name and code_version(t) == code
            and same(t.get("config") or {}) and list((t.get("config") or {}).get("sizes", ())) ==
            [max(cfg.get("sizes") or [0])]]
    how = "the code the recipes were tuned with" if cfg.get("tuned_code") else \
        "the runs' own: their config records no tuning code"
    note = (f"{len(kept)} of {len(trials)} tuning trials match the runs shown (sweep {name!r}, the runs' config, "
            f"code {code}, {how})")
    if len(kept) < len(trials):
        note += f"; {len(trials) - len(kept)} of other configs or code left out"
    return kept, note


def recipe_grid_positions(trials: Sequence[dict], chosen: Sequence[tuple[str, str, float, float]]) -> list[str]:
    """One line per recipe of ``chosen``: where its learning rate and weight decay sit among the values its family's
    ``trials`` tried with the same optimizer (the largest or smallest tried: at an edge of the grid, where the best
    recipe may lie beyond it), and whether it is the trials' best by validation accuracy; then, when any is at an
    edge, a line saying what that means."""
    grid_order = {(f, tuple(r)): i for f, rs in TUNING_GRID.items() for i, r in enumerate(rs)}
    ok = sorted((t for t in trials if t.get("status") == "ok"),  # grid order: the first of equals wins, as in tune
                key=lambda t: grid_order.get((t["spec"]["family"], tuple(t["config"]["recipes"][0][1:])), 1 << 30))
    best = _winners(ok)
    lines, edge = [], False

    def where(v: float, values: list[float], what: str) -> str:
        nonlocal edge
        tried = ", ".join(f"{x:g}" for x in values)
        if len(values) < 2:
            return f"{what} {v:g} (the only value tried)"
        if v not in values:
            return f"{what} {v:g} (not among the values tried: {tried})"
        if v in (values[0], values[-1]):
            edge = True
            return f"{what} {v:g} (the {'largest' if v == values[-1] else 'smallest'} of {tried} tried: at the " \
                   f"{'top' if v == values[-1] else 'bottom'} edge of the grid)"
        return f"{what} {v:g} (inside the range tried, {tried})"

    for fam, opt, lr, wd in chosen:
        mine = [t["config"]["recipes"][0] for t in trials if t["spec"]["family"] == fam]
        if not mine:
            lines.append(f"{fam}: {opt} lr {lr:g}, weight decay {wd:g}: no tuning trial of {fam} among these")
            continue
        same = [r for r in mine if r[1] == opt]
        line = f"{fam}: {opt} " + where(lr, sorted({float(r[2]) for r in same}), "lr") + ", " + \
            where(wd, sorted({float(r[3]) for r in same}), "weight decay")
        others = sorted({r[1] for r in mine} - {opt})
        if others:
            line += f"; also tried: {', '.join(others)}"
        if fam in best and best[fam] != (fam, opt, float(lr), float(wd)):
            line += f"; NOT the trials' best by validation accuracy ({best[fam][1]} lr {best[fam][2]:g}, weight " \
                    f"decay {best[fam][3]:g})"
        lines.append(line)
    if edge:
        lines.append("A recipe at an edge of its grid may be short of its family's best: the grid did not try beyond "
                     "it, so the families had the same tuning budget, not necessarily their best recipes.")
    return lines


def _cpu_per_image(r: Mapping, sweep: SweepConfig) -> float:
    """CPU seconds per training image of a finished run: its training CPU seconds over the images it trained plus
    its validation passes, each counted as a third of its images (a forward pass, against a training step's forward
    and backward)."""
    m = r["metrics"]
    n = int(r["spec"]["size"])
    cfg = sweep.train_config(RunSpec(r["spec"]["family"], n, 0), n)
    images = int(m["steps"]) * cfg.batch_size + int(m.get("evaluations") or 0) * _val_images(sweep) / 3
    return float(m["train_cpu_seconds"]) / images


def _val_images(sweep: SweepConfig) -> int:
    return sweep.val_per_class * len(sweep.pretrain_classes)


def plan_table(sweep: SweepConfig, timing: Sequence[Mapping]) -> str:
    """Markdown: the CPU hours ``sweep``'s grid and its tuning take at most, from ``timing`` (finished runs of each
    family, e.g. one tiny point each, made by this code's training loop): per family its CPU seconds per training
    image (``_cpu_per_image``) and outside training per run (data, Fig. 7, probe); per size the images a run trains
    at its cap (an early-stopped run trains fewer) with its validation passes, and the CPU hours of every family's
    runs over all seeds at that cap. Then the totals, and the tuning's (every recipe of ``vitlab.studies.tuning.TUNING_GRID``
    on the largest size)."""

    rate = {r["spec"]["family"]: (_cpu_per_image(r, sweep), float(r["metrics"]["cpu_seconds"])
                                  - float(r["metrics"]["train_cpu_seconds"])) for r in [r for r in timing if r.get("status") == "ok"]}
    missing = [f for f in sweep.families if f not in rate]
    if missing:
        raise ValueError(f"no finished timing run of {missing}: time one point of each family first")

    def run_hours(fam: str, n: int) -> float:
        cfg = sweep.train_config(RunSpec(fam, n, 0), n)
        evals = math.ceil(cfg.epochs / cfg.eval_every)
        images = cfg.epochs * (n // cfg.batch_size) * cfg.batch_size + evals * _val_images(sweep) / 3
        return (rate[fam][0] * images + rate[fam][1]) / 3600

    lines = ["| size | images per run at the cap | " + " | ".join(f"{f} CPU h ({len(sweep.seeds)} seeds)"
                                                          for f in sweep.families) + " |",
             "|---|---|" + "---|" * len(sweep.families)]
    total = 0.0
    for n in sorted(sweep.sizes):
        cfg = sweep.train_config(RunSpec(sweep.families[0], n, 0), n)
        hours = [len(sweep.seeds) * run_hours(f, n) for f in sweep.families]
        total += sum(hours)
        lines.append(f"| {n:,} | {cfg.epochs * (n // cfg.batch_size) * cfg.batch_size:,} | "
                     + " | ".join(f"{h:.1f}" for h in hours) + " |")
    top = max(sweep.sizes)
    tuning = sum(len(TUNING_GRID.get(f, ((),))) * run_hours(f, top) for f in sweep.families)
    per = ", ".join(f"{f} {1000 * rate[f][0]:.2f} ms per image and {rate[f][1]:.0f} s per run outside training"
                    for f in sweep.families)
    lines += ["", f"At most {total:,.0f} CPU hours for the grid and {tuning:,.0f} for the tuning ({total + tuning:,.0f} "
                  f"in all: {(total + tuning) / 2 / 24:.1f} days of 2 cores), every run at its cap; measured CPU "
                  f"cost: {per}."]
    return "\n".join(lines)
