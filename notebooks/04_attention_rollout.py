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
# # Attention rollout (Fig. 6 and 14, App. D.8)
# Rollout (Abnar & Zuidema 2020) multiplies the head-averaged attention of all layers, with the residual
# connection as an identity, to get the output token's attention to the input patches. Beside it: the
# class-specific gradient rollout, integrated gradients and occlusion, and how faithful each is.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default; or a timm ViT with a classifier head
# (online), e.g. AugReg's "vit_base_patch16_224.augreg2_in21k_ft_in1k": the class-specific maps below need class
# scores, which the paper's own ".orig_in21k" weights (no head) do not give
N_IMAGES = 4 if SMOKE else 16

# %%
import torch

import vitlab
from vitlab.data.images import default_images
from vitlab.figures.plots import image_grid_with_maps, notebook_figures
from vitlab.inspect import ATTRIBUTION_METHODS

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model(MODEL)
names, x, shown = default_images(model, N_IMAGES)
rows, maps = vitlab.compare_methods(model, x, sanity=not SMOKE)
show = torch.stack([maps[m][:4] for m in ATTRIBUTION_METHODS], 1)
image_grid_with_maps(shown[:4], show.numpy(), names[:4], list(ATTRIBUTION_METHODS), title="Maps per method")

# %%
for r in rows:
    print(f"{r.method:22s} deletion {r.deletion_auc:.3f}  insertion {r.insertion_auc:.3f}  "
          f"sanity {r.sanity_spearman if r.sanity_spearman is None else round(r.sanity_spearman, 3)}")

# %% [markdown]
# ## Localisation on the synthetic shapes
# The shipped shapes ViT was trained to name the shape; the masks say where it is.

# %%
from vitlab.data.shapes import LOCALISATION_SHAPES
from vitlab.inspect.compare import shapes_localisation
from vitlab.models.load import SHAPES_CHECKPOINT

shapes_model = vitlab.load_model(str(SHAPES_CHECKPOINT))
# the function and the sample of the report's localisation table (`vitlab reproduce`): the same numbers
data, loc_rows, loc_maps = shapes_localisation(shapes_model, n=8 if SMOKE else LOCALISATION_SHAPES, sanity=False)
print(f"{len(data)} test shapes (seed 1{'' if len(data) == LOCALISATION_SHAPES else f'; the report scores {LOCALISATION_SHAPES}'}); "
      f"object area share (the score of a uniform map): {float(data.masks.double().mean()):.3f}")
for r in loc_rows:
    print(f"{r.method:22s} mass in object {r.mass_in_mask:.3f}  pointing {r.pointing:.3f}")

# %% [markdown]
# **Paper:** the rolled-out attention of the output token lands on the object that decides the class (Fig. 6).
# **Here:** the maps above, a deletion/insertion comparison against a random map (lower deletion and higher
# insertion than random mean the map ranks patches the model relies on), a sanity check (near-zero correlation
# with the maps of a re-initialised model), and the verdict below: whether rollout puts more of its mass on the
# object than a random map does, on the shapes, where the masks are known.

# %%
from dataclasses import replace

from vitlab.data.images import default_data_words
from vitlab.findings import model as findings
from vitlab.findings.explain import explain
from vitlab.findings.verdict import verdict_table
from vitlab.inspect import localisation

ro, rnd = localisation(loc_maps["rollout"], data.masks), localisation(loc_maps["random map"], data.masks)
verdicts = [findings.rollout_localises(ro["mass_in_mask"], ro["pointing"], rnd["mass_in_mask"], rnd["pointing"])]
# the criterion checked on controls with a known answer (a map equal to the mask, a uniform map), as the report does
from vitlab.findings import controls

verdicts = controls.validate(verdicts, controls.rollout_controls(data.masks, tuple(loc_maps["rollout"].shape[-2:]),
                                                                 rnd["mass_in_mask"], rnd["pointing"]))
for row in controls.validation_table(verdicts):
    print(f"{row['key']:<24} {row['control']:<36} expected {row['expected']:<14} observed {row['observed']}")
subject = f"{SHAPES_CHECKPOINT.name} (shipped) on {default_data_words(shapes_model, len(data))}"  # each row judges
verdicts = [replace(v, subject=subject) for v in verdicts]
print(verdict_table(verdicts))
print()
print(explain(verdicts, width=110))
