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
# # Patch-embedding filters (Fig. 7 left)
# The first layer linearly projects each flattened patch. The paper shows the top 28 principal components of
# the learned embedding filters of ViT-L/32.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None
K = 28

# %%
import vitlab
from vitlab.plots import filter_grid

model = vitlab.load_model(MODEL)
k = min(K, vitlab.model_info(model).embed_dim)
components, ratio = vitlab.embedding_filter_pca(model, k=k)
filter_grid(components.numpy(), ratio.numpy(), title="Principal components of the patch-embedding filters")

# %%
print(f"top {k} components explain {100 * float(ratio.sum()):.1f}% of the variance; first: {100 * float(ratio[0]):.1f}%")

# %% [markdown]
# **Paper:** the components "resemble plausible basis functions for a low-dimensional representation of the fine
# structure within each patch" (smooth gradients, colour blobs, oriented edges at increasing frequency).
# **Here:** the numbers above; with 4 px patches of a CIFAR-10 model the components are 4x4 colour and
# gradient patterns, the same low-frequency-first ordering at a much smaller scale.
