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
# # Beyond the paper: a causal head atlas and token diagnostics
# Fig. 7 (right) shows that some heads of the lowest layers attend locally and others globally; it does not say
# whether either kind matters for the prediction. **Part 1**, the head atlas: each head's output is replaced by its
# mean over the images (mean ablation) or by zero, one head at a time, and the drop in the log-probability of the
# true class measured, with a 95% interval over images (`vitlab.head_importance`).
#
# **Part 2**, token diagnostics: how much attention goes to the prefix tokens (class, distillation, registers;
# `vitlab.prefix_attention`), how much the prefix convention of the distance and rollout figures matters, and
# whether some patches carry high-norm outliers (`vitlab.token_norms`; Darcet et al. 2024, "Vision Transformers Need
# Registers"), for the shipped default and for a randomly initialised ViT-S with 4 registers.
#
# Every number and sentence below is the report's own (`vitlab reproduce` builds these sections with the same
# functions, `vitlab.report.atlas`).

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default (a distilled ViT on CIFAR-10)
N_IMAGES = 8 if SMOKE else None  # None: all 128 shipped CIFAR-10 test images for 32 px models
REGISTER_DEPTH = 4 if SMOKE else 12  # the random-init register model: ViT-S/4 at 32 px with 4 registers

# %%
import timm
import torch

import vitlab
from vitlab.images import default_images, default_labels, head_class_names
from vitlab.plots import notebook_figures
from vitlab.report import atlas as A
from vitlab.report import sections as S

notebook_figures()  # figures survive `jupyter nbconvert --to html`


def report_inputs(model, n_images, name):
    """The report's inputs for ``model`` on its default images (the shipped CIFAR-10 sample for 32 px models)."""
    names, x, shown = default_images(model, n_images)
    labels, _ = default_labels(model, len(names))
    base = {"model": name, "weights": "see the model", "versions": {}, "images": f"{len(names)} default images"}
    return S.Inputs(model, vitlab.model_info(model), names, x, shown, base, labels, head_class_names(model))


model = vitlab.load_model(MODEL)
inp = report_inputs(model, N_IMAGES, MODEL or "embedded default")
pred = S.prediction_pass(inp)  # predictions and the mean attention distance per head, as the report measures them
print(f"{len(inp.x)} images; {inp.info.depth} blocks x {inp.info.num_heads} heads; prefix tokens "
      f"{', '.join(inp.info.prefix_kinds) or 'none'}")

# %% [markdown]
# ## Part 1: the head atlas
# Each dot is a head: its mean attention distance (x) and its importance (y), with the 95% interval over images.
# Squares and diamonds are the lowest layers' local and global heads (the nearer and farther half by distance).

# %%
atlas = A.head_atlas(inp, pred)
atlas.figure

# %%
print(atlas.ours)

# %%
m = atlas.metrics
for ablation, r in m["ablations"].items():
    for group, g in r["groups"].items():
        if g is not None:
            lo, hi = g["interval"]
            print(f"{ablation:>4} ablation, lowest layers' {group:<6} heads: {g['drop']:+.4f} nats per head "
                  f"[{lo:+.4f}, {hi:+.4f}] -> {g['matters']}")

# %% [markdown]
# ## Part 2: token diagnostics of the shipped default

# %%
prefix, norms = A.token_sections(inp, pred)
prefix.figure

# %%
print(prefix.ours)

# %%
norms.figure

# %%
print(norms.ours)
print(f"outlier verdict (default): {norms.metrics['verdict']}")

# %% [markdown]
# ## Part 2b: a randomly initialised ViT-S with 4 registers
# timm's `vit_small_patch16_224` configuration (width 384, 6 heads), built without weights, at 32 px with 4x4
# patches and 4 register tokens beside the class token. Random weights: no outliers are expected (Darcet et al.
# see them after long training of large models), and attention spreads over all tokens.

# %%
torch.manual_seed(0)
registers = timm.create_model("vit_small_patch16_224", pretrained=False, img_size=32, patch_size=4, reg_tokens=4,
                              num_classes=10, depth=REGISTER_DEPTH).eval()
reg_inp = report_inputs(registers, N_IMAGES, "vit_small_patch16_224 config, 4 registers, random init")
reg_pred = S.prediction_pass(reg_inp)
reg_prefix, reg_norms = A.token_sections(reg_inp, reg_pred)
print(f"prefix tokens: {', '.join(reg_inp.info.prefix_kinds)}")
reg_prefix.figure

# %%
print(reg_prefix.ours)

# %%
reg_norms.figure

# %%
print(reg_norms.ours)
print(f"outlier verdict (random-init register model): {reg_norms.metrics['verdict']}")
