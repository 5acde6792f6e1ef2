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
# # Data scaling (Fig. 3/4)
# The paper pre-trains ViTs and BiT ResNets on growing subsets of JFT-300M (9M, 30M, 90M, 300M images) and probes
# few-shot on ImageNet: ResNets do better on small data, ViTs overtake them as data grows.
#
# **The analogue here.** Pre-train on nested, class-balanced subsets of CIFAR-10 classes 0-4 (100 to 5,000 images,
# a 50x range), then probe the frozen features few-shot on classes 5-9, which the models never saw. Three families
# as in Fig. 5: a ViT, a BiT-style ResNet (GroupNorm of at least 8 channels per group, weight standardisation) and a
# hybrid (a small ResNet whose feature map is the ViT's token grid), with about the same parameter count. Each
# family's recipe (optimizer, learning rate, weight decay) is tuned once on the largest subset against a validation
# split carved from the pre-training classes' training images and frozen; every run is reported at its best
# validation epoch (early stopping, as the paper); 3 seeds per point in the shipped sweep.
# **Its limits:** 32 px images, four orders of magnitude less data, small models and short schedules, and transfer
# between halves of one dataset rather than across datasets. The curves test the direction of the paper's
# finding, not its numbers.

# %% tags=["parameters"]
import os
from pathlib import Path

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
RESULTS = Path(os.environ.get("VITLAB_RESULTS", "../data/results/scaling_cifar10.jsonl"))
SHOTS = 10

# %%
from vitlab.plots import scaling_curves
from vitlab.scaling import SWEEPS, ResultsStore, run_sweep, summarise, summarise_compute
from vitlab.plots import notebook_figures

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
for fam, by_size in summary.items():
    print(fam, {n: f"{100 * v['mean']:.1f}% ± {100 * v['std']:.1f} ({v['n']} seeds)" for n, v in by_size.items()})

# %% [markdown]
# **An equal chance for each family.** Every trial of the tuning grid (on the largest subset, seed 0), its best
# validation accuracy and the recipe frozen for the sweep:

# %%
from IPython.display import Markdown, display

from vitlab.scaling import load_sweep_config, tuning_table

tuning, tuned = RESULTS.with_suffix(".tuning.jsonl"), RESULTS.with_suffix(".tuned.json")
if tuning.exists():
    chosen = load_sweep_config(str(tuned)).recipes if tuned.exists() else ()
    display(Markdown(tuning_table(ResultsStore(tuning).records(), SHOTS, chosen)))
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
# data grows (Fig. 3, Fig. 4). **Here:** the verdict below, paired by seed: does the ViT's lead over the ResNet grow
# (or its deficit shrink) from the smallest to the largest pre-training set?

# %%
from vitlab import findings

try:
    verdicts = [findings.scaling_gap_narrows(records, shots=SHOTS, resnet="bit" if not SMOKE else "bit_tiny",
                                             vit="vit" if not SMOKE else "vit_tiny")]
    print(findings.verdict_table(verdicts))
    print()
    print(findings.explain(verdicts, width=110))
except ValueError as e:
    print(f"not judged: {e}")
