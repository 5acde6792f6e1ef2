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
# # Position embeddings (Fig. 7 centre)
# Cosine similarity between the learned position embedding of each patch and those of all other patches.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default; or a timm ViT (online), e.g. the
# paper's own weights "vit_large_patch32_224.orig_in21k", or AugReg's "vit_base_patch16_224.augreg2_in21k_ft_in1k"

# %%
import vitlab
from vitlab.app.widgets import PositionExplorer
from vitlab.figures.plots import notebook_figures, similarity_tiles

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model(MODEL)
sim = vitlab.position_embedding_similarity(model)
score = vitlab.position_structure_score(sim)
similarity_tiles(sim.numpy(), title=f"Position-embedding similarity (Spearman with grid distance {score:.3f})")

# %% [markdown]
# Click a patch to see its similarity map:

# %%
PositionExplorer(model)

# %% [markdown]
# The same after resampling the embeddings to twice the grid, as for fine-tuning at a higher resolution (§3.2):

# %%
gh, gw = vitlab.model_info(model).grid_size
sim2 = vitlab.position_embedding_similarity(model, grid=(2 * gh, 2 * gw))
print(f"Spearman at {gh}x{gw}: {score:.3f}; resampled to {2 * gh}x{2 * gw}: {vitlab.position_structure_score(sim2):.3f}")

# %% [markdown]
# **Paper:** closer patches tend to have more similar position embeddings, and a row-column structure appears:
# the model learns the 2D topology from 1D embeddings. **Here:** the verdicts below decide both on this model
# (rank correlation of similarity with grid distance; same-row/column pairs against other pairs at equal distance).

# %%
from dataclasses import replace

from vitlab.findings import controls
from vitlab.findings import model as findings
from vitlab.findings.explain import explain
from vitlab.findings.judge import model_label
from vitlab.findings.verdict import verdict_table
from vitlab.inspect import position_table

# each criterion first checked on controls with a known answer (a sin-cos table, an isotropic one, this model's
# table permuted across the grid), as the report does
verdicts = controls.validate(findings.judge_positions(sim), controls.position_controls(position_table(model)))
if len(verdicts) < 2:  # grids too small for pairs at equal distance inside and outside rows
    print("row/column structure not judged: the grid needs a side of at least 6 and the other of at least 4")
for row in controls.validation_table(verdicts):
    print(f"{row['key']:<24} {row['control']:<55} expected {row['expected']:<14} observed {row['observed']}")
verdicts = [replace(v, subject=f"{model_label(model, MODEL)}, weights alone") for v in verdicts]  # each row judges
print(verdict_table(verdicts))
print()
print(explain(verdicts, width=110))
