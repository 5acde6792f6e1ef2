# ---
# jupyter:
#   jupytext:
#     formats: ipynb,py:percent
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Data scaling (Fig. 4; Fig. 3 for fine-tuning)
# The paper pre-trains ViTs and BiT ResNets on growing random subsets of JFT-300M (9M, 30M, 90M, 300M images) and
# probes the frozen features few-shot (linear 5-shot) on ImageNet (Fig. 4): ResNets do better on small data, ViTs
# overtake them as data grows. Fig. 3 shows the same direction for fine-tuning accuracy on ImageNet after
# pre-training on ImageNet, ImageNet-21k and JFT-300M; this notebook measures the few-shot kind, as Fig. 4.
#
# **The analogue here.** Pre-train on nested, class-balanced subsets of some CIFAR-10 classes, then probe the frozen
# features few-shot on the other classes, which the models never saw (the cell after the figure prints the classes,
# subset sizes and seeds of the sweep shown, from its records). The families of Fig. 5: a ViT, a BiT-style ResNet
# (GroupNorm of at least 8 channels per group, weight standardisation) and a hybrid (a small ResNet whose feature
# map is the ViT's token grid), with about the same parameter count. Each family's recipe (optimizer, learning rate,
# weight decay) is tuned once on the largest subset against a validation split carved from the pre-training
# classes' training images and frozen; every run is reported at its best validation epoch (early stopping, as the
# paper).
# **Its limits:** 32 px images, far less data (the same cell prints how much less than JFT-300M), small models and
# short schedules, and transfer between halves of one dataset rather than across datasets. The curves test the
# direction of the paper's finding, not its numbers.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
RESULTS = Path(os.environ.get("VITLAB_RESULTS", "../data/results/scaling_cifar10.jsonl"))
SHOTS = 10

# %%
from vitlab.figures.plots import notebook_figures, scaling_curves
from vitlab.studies.scaling import SWEEPS, ResultsStore, run_sweep, summarise, summarise_compute

notebook_figures()  # figures survive `jupyter nbconvert --to html`

if SMOKE:  # a two-size sweep on the shapes, into a scratch store
    import tempfile

    RESULTS = Path(tempfile.mkdtemp()) / "quick.jsonl"
    run_sweep(SWEEPS["quick"], RESULTS, workers=0, progress=False)
    SHOTS = 5
if not RESULTS.is_file():
    raise FileNotFoundError(f"no sweep results at {RESULTS.resolve()}: run this notebook from notebooks/, set "
                            "VITLAB_RESULTS to a results store, or run `make sweep` to make one")
newest, shown = ResultsStore(RESULTS).newest_sweep_with_note()  # the last sweep's config only, never mixed
records = list(newest.values())
print(f"{len(records)} runs in {RESULTS} ({sum(r['status'] == 'ok' for r in records)} finished): {shown}")
summary = summarise(records, SHOTS)
compute = summarise_compute(records)  # {family: {size: pre-training FLOPs}}, from FlopCounterMode per run
scaling_curves(summary, title=f"{SHOTS}-shot accuracy on held-out classes against pre-training images and compute",
               compute=compute or None)

# %%
import math

if records:  # the design of the sweep shown, from its own config
    cfg = records[0]["config"]
    sizes = sorted(cfg["sizes"])
    print(f"sweep {cfg['name']!r}: pre-training on {cfg['data']} classes {cfg['pretrain_classes']}, nested subsets of "
          f"{sizes[0]:,} to {sizes[-1]:,} images ({sizes[-1] / sizes[0]:g}x), {len(cfg['seeds'])} seed(s) per point; "
          f"few-shot probe on classes {cfg['probe_classes']} ({cfg['shots']} shots)")
    print(f"JFT-300M's 300M images are {300e6 / sizes[-1]:,.0f}x its largest subset "
          f"({math.log10(300e6 / sizes[-1]):.1f} orders of magnitude)")
for fam, by_size in summary.items():
    print(fam, {n: f"{100 * v['mean']:.1f}% ± {100 * v['std']:.1f} ({v['n']} seeds)" for n, v in by_size.items()})

# %% [markdown]
# **The same tuning budget for each family, on a coarse grid.** Every trial of the tuning grid behind the runs shown
# (the largest subset, seed 0; the runs' own config and the code their recipes were tuned with), its best validation
# accuracy, and marked the recipe those runs trained with, read from their own config. The lines under the table
# say where each marked recipe sits in its family's grid: one at an edge (the largest or smallest value tried) may be
# short of that family's best recipe, since the grid tried nothing beyond it.

# %%
from IPython.display import Markdown, display

from vitlab.studies.tuning import plotted_recipes, recipe_grid_positions, tuning_table, tuning_trials_for

tuning = RESULTS.with_suffix(".tuning.jsonl")
if tuning.exists():
    trials, matched = tuning_trials_for(records, ResultsStore(tuning).records())
    chosen = plotted_recipes(records)  # the recipes the plotted runs trained with
    print(f"{tuning.name}: {matched}")
    if trials:
        display(Markdown(tuning_table(trials, SHOTS, chosen)))
        print("\n".join(recipe_grid_positions(trials, chosen)))
else:
    print(f"no tuning trials next to {RESULTS.name} (the smoke sweep is not tuned)")

# %% [markdown]
# Rerun or extend the sweep in two steps from the repository root: `vitlab sweep --config cifar10 --tune
# --results data/results/scaling_cifar10.jsonl --save-config data/results/scaling_cifar10.tuned.json` tunes each
# family once on the largest subset (validation split, never the test images) and freezes the winners; `vitlab sweep
# --config data/results/scaling_cifar10.tuned.json --results data/results/scaling_cifar10.jsonl` runs the grid
# (finished runs are skipped; `--executor ray --address ...` spreads the runs over a Ray cluster).
#
# **Paper:** with little pre-training data the ResNets' few-shot accuracy is higher; the ViTs overtake them as the
# data grows (Fig. 4; Fig. 3 shows the same for fine-tuning accuracy). **Here:** the verdict below, paired by seed:
# does the ViT's lead over the ResNet grow (or its deficit shrink) from the smallest to the largest pre-training set?

# %%
from vitlab.findings import controls
from vitlab.findings import studies as study_findings
from vitlab.findings.explain import explain
from vitlab.findings.verdict import verdict_table

vit_name, resnet_name = ("vit_tiny", "bit_tiny") if SMOKE else ("vit", "bit")
# the gap and the locality verdicts, each checked on its controls, as the report judges them
judged, why = controls.judge_study(records, SHOTS, vit_name, resnet_name)
if why:
    print(f"not judged: {why}")
verdicts = [v for v in judged if v.key == study_findings.KEY_SCALING]
local = [v for v in judged if v.key != study_findings.KEY_SCALING]
if verdicts:
    print(verdict_table(verdicts))
    print()
    print(explain(verdicts, width=110))

# %% [markdown]
# **What the intervals allow.** The same runs as paired differences: at each size, the ViT (and the hybrid) minus the
# ResNet, seed by seed on the same subset and probe pool, with the 95% interval over seeds, its half-width against
# the study's target of ±3 points, and the seeds the observed spread would need for it. Then each run's best against
# its last epoch (a run whose best epoch is its last stopped while still improving), and what the runs cost.
# The study sized to decide (`cifar10_10k`: 11 seeds, early stopping, up to 10,000 images, Fig. 7 statistics per
# run; `make scaling-study`) has no records yet: where the runs shown predate it, the locality verdict below says so.

# %%
from vitlab.studies.scaling import cost_table, stopping_table
from vitlab.findings.studies import difference_table

for fam in sorted({r["spec"]["family"] for r in records if r["status"] == "ok"} - {resnet_name}):
    display(Markdown(difference_table(records, SHOTS, fam, resnet_name)))
display(Markdown(stopping_table(records)))
display(Markdown(cost_table(records, trials if tuning.exists() else ())))  # with the tuning's cost

# %% [markdown]
# **Raghu et al. 2021 along the data axis:** ViTs pre-trained on less data learn fewer local heads in their lowest
# layer. Each ViT and hybrid run records the lowest layer's heads' mean attention distances on the 128 fixed test
# images. The figure draws, per size, their mean and the most local head (as % of the uniform-attention distance) and
# the share of heads below half of it, with 95% intervals over seeds. The verdict needs no threshold for "local": the
# lowest layer's mean head distance at the smallest size minus at the largest, per seed (> 0: more local with more
# data). Its controls: the smallest size's heads with their most global half made local (must show), another seed's
# heads (no change, must not).

# %%
from vitlab.figures.plots import locality_curves
from vitlab.findings.studies import locality_by_size, locality_words, study_words
from vitlab.train.emergence import LOCAL_HEAD

if local:  # judged with the gap above
    by_family = {v.details["family"]: locality_by_size(records, v.details["family"]) for v in local}
    display(locality_curves(by_family, LOCAL_HEAD, title="The lowest layer's attention distance against "
                            "pre-training images (error bars: 95% interval over seeds)"))
    for fam, by in by_family.items():
        print(f"{fam}: {locality_words(by)}")
    print()
    print(verdict_table(local))
    print()
    print(explain(local, width=110))
    for row in controls.validation_table(local):
        print(f"  control {row['control']!r} ({row['kind']}): {row['observed']}, passed: {row['passed']}")
else:
    print("not judged: no ViT or hybrid runs shown hold Fig. 7 statistics at 2 or more sizes (a sweep from before "
          "runs recorded them)")

# %% [markdown]
# **What the intervals allow**, in words formatted from these records and their verdicts, as the report states them.

# %%
if verdicts or local:
    print(study_words(records, verdicts + local, SHOTS, vit_name, resnet_name))
