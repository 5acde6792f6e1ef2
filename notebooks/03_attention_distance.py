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
# # Mean attention distance (Fig. 7 right, Fig. 11, App. D.7)
# For each head: the pixel distance between query and key patches, weighted by attention, averaged over
# queries and images. The paper uses 128 images.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default; or a timm ViT (online), e.g. the
# paper's own weights "vit_large_patch32_224.orig_in21k", or AugReg's "vit_base_patch16_224.augreg2_in21k_ft_in1k"
N_IMAGES = 8 if SMOKE else None  # None: all 128 shipped CIFAR-10 test images for 32 px models (the paper uses 128)

# %%
from dataclasses import replace

import vitlab
from vitlab.data.images import default_images
from vitlab.figures.plots import layer_lines, notebook_figures
from vitlab.inspect.distance import uniform_attention_distance

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model(MODEL)
_, x, _ = default_images(model, N_IMAGES)
per_image = vitlab.mean_attention_distance(model, x, per_image=True)  # (L, B, H)
dist = per_image.mean(1)
from vitlab.data.images import default_data_words
from vitlab.findings import model as findings
from vitlab.findings.explain import explain
from vitlab.findings.judge import model_label
from vitlab.findings.verdict import verdict_table

info = vitlab.model_info(model)
ceiling = uniform_attention_distance(info.grid_size, info.patch_size)  # uniform attention over the grid
layer_lines(dist.numpy(), "mean attention distance (pixels)",
            f"Mean attention distance per head ({per_image.shape[1]} images)", spread=per_image.mean(2).std(1).numpy(),
            reference=(ceiling, f"uniform attention: {ceiling:.1f} px"), spread_label="std over images")

# %%
print(f"lowest layer: heads from {float(dist[0].min()):.1f} to {float(dist[0].max()):.1f} px; "
      f"last layer mean {float(dist[-1].mean()):.1f} px")
renorm = vitlab.mean_attention_distance(model, x, renormalize=True)
print(f"renormalised over patch keys: last layer mean {float(renorm[-1].mean()):.1f} px")

# %% [markdown]
# **Paper:** some heads attend to most of the image already in the lowest layers, others stay local; the
# attention distance increases with depth. **Here:** two verdicts on these images, measured against the distance
# of uniform attention over this grid (a reference, not a ceiling: a head that attends to far patches only goes
# beyond it).

# %%
from vitlab.findings import controls

# each verdict under every form of the distance convention (prefix attention dropped with and without renormalising;
# pixels or patches), its criterion checked on controls with a known answer, as the report does
per_renorm = vitlab.mean_attention_distance(model, x, per_image=True, renormalize=True)
dists = dict(zip(findings.DISTANCE_CONVENTIONS, (per_image, per_renorm)))
ceilings = dict(zip(findings.DISTANCE_CONVENTIONS, (ceiling, ceiling)))
ph, pw = info.patch_size
if ph == pw:  # square patches: a distance in patches is the distance in pixels over the side
    dists[findings.DISTANCE_CONVENTIONS[2]], ceilings[findings.DISTANCE_CONVENTIONS[2]] = per_image / ph, ceiling / ph
verdicts = controls.validate(findings.judge_distance(dists, ceilings), controls.distance_controls(per_image, ceiling))
for row in controls.validation_table(verdicts):
    print(f"{row['key']:<26} {row['control']:<70} expected {row['expected']:<14} observed {row['observed']}")
print(f"uniform attention over the {info.grid_size[0]}x{info.grid_size[1]} grid: {ceiling:.1f} px")
subject = f"{model_label(model, MODEL)} on {default_data_words(model, len(x))}"  # what each row judges
verdicts = [replace(v, subject=subject) for v in verdicts]
print(verdict_table(verdicts))
print()
print(explain(verdicts, width=110))
