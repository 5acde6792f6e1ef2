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
# # When the Fig. 7 findings emerge during training, with and without a teacher
# The paper shows trained ViTs only: position embeddings whose similarity falls with grid distance, lowest-layer heads
# from local to global, attention distance growing with depth. Its ViTs had no teacher; vitlab's default was
# distilled from CNN teachers, and DeiT reports that a teacher passes some of its inductive bias to the student.
#
# Here: the shipped recipes (`data/checkpoints/recipes/NAME/seed<n>`, written by `vitlab export-recipe`; see
# `docs/recipes.md`), each a folder of seeds whose cards hold the Fig. 7 statistics of every epoch's snapshot on the
# 128 shipped CIFAR-10 test images (`vitlab.train.emergence`). We draw them against training images seen, one band per
# recipe over its seeds, and say when the local heads and the 2D position structure appear: the first epoch at which
# the seeds' mean has made half of its change over training. The test accuracies (measured once, on export) come with
# an interval over seeds. `vitlab reproduce` judges the findings themselves per recipe (its "recipes" section).

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
# the shipped recipes: a folder per recipe, a checkpoint folder per seed (vitlab export-recipe)
RECIPES = os.environ.get("VITLAB_RECIPES", "../data/checkpoints/recipes")

# %%
from pathlib import Path

import numpy as np
from IPython.display import Markdown, display

from vitlab.base.intervals import n_units
from vitlab.figures.plots import emergence_curves, notebook_figures
from vitlab.findings.recipe import (
    RECIPE_COMMAND,
    emergence_lines,
    emergence_summary,
    recipe_accuracy,
    recipe_cards,
    shipped_recipes,
)

notebook_figures()
found = shipped_recipes(Path(RECIPES))
cards = {name: recipe_cards(seeds) for name, seeds in found.items()}
if not found:
    print(f"No shipped recipes in {Path(RECIPES).resolve()}: nothing to draw. Train the seeds "
          "(vitlab train --preset vit_cifar10_noteacher --set seed=N, and vit_cifar10_distilled) and ship them with "
          f"{RECIPE_COMMAND}.")
else:
    for name, cs in cards.items():
        print(f"{name}: {n_units(len(cs), 'seeds')} ({', '.join(str(c['seed']) for c in cs)}), teacher {cs[0].get('teacher') or 'none'}, "
              f"{cs[0]['epochs_done']} epochs" + (" (a shortened schedule)" if cs[0].get("shortened") else ""))
    if len(found) < 2:
        print(f"Only one recipe is shipped ({', '.join(found)}): the comparison needs two; {RECIPE_COMMAND}.")

# %% [markdown]
# ## Test accuracy over seeds
# Each seed's accuracy on the whole test split, from its fp16 weights as shipped; the interval is a Student t interval
# of the mean over seeds (none for one seed).

# %%
for name, v in recipe_accuracy(cards).items():
    lo, hi = v["interval"]
    span = f"[{lo:.2%}, {hi:.2%}]" if np.isfinite(lo) else "no interval"
    print(f"{name}: mean {v['mean']:.2%} {span} ({v['method']}); seeds "
          + ", ".join(f"{a:.2%}" for a in v["test_accuracy"]))

# %% [markdown]
# ## The statistics during training
# Mean over seeds, with a band from their min to max, against the training images seen (epochs x training examples).

# %%
bands, times, missing = emergence_summary(cards)
if missing:
    print(f"No emergence records in the cards of {', '.join(missing)}: export their runs again with {RECIPE_COMMAND}.")
if bands:
    emergence_curves(bands, title="Fig. 7 statistics during training: mean over seeds, band min to max").show()

# %% [markdown]
# ## When do local heads and 2D position structure appear?
# Local heads: the lowest layer's most local head, its mean attention distance as a share of uniform attention's
# (falls as a head becomes local). 2D position structure: the Spearman correlation between position-embedding
# similarity and grid distance (falls towards -1 as the table learns the grid). Each: the first epoch at which the
# seeds' mean has made half of its change from the first to the last epoch. A most local head that moves part of the
# way is not yet a local head: the share of lowest-layer heads below half the uniform distance says whether any is.

# %%
lines = emergence_lines(times)
display(Markdown("\n".join(f"* {line}" for line in lines) if lines else "Nothing to state: no recipe with emergence records is shipped."))
