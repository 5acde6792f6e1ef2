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
# # Do ViTs see like CNNs? Representation similarity by CKA (Raghu et al. 2021, beyond the paper)
# Linear CKA (Kornblith et al. 2019) compares two layers' representations of the same images: 1 for
# representations equal up to a rotation and a scale, near 0 for unrelated ones. It is computed in mini-batches with
# the unbiased HSIC estimator (Nguyen et al. 2021), so memory does not grow with the number of images.
#
# Raghu et al. 2021 ("Do Vision Transformers See Like Convolutional Neural Networks?", NeurIPS) find that a ViT's
# representations are much more uniform across depth than a ResNet's (its lower and higher layers are alike), and
# that the ResNet's lower half of layers matches about the lowest quarter of the ViT's. This notebook measures both
# for the shipped default ViT against the shipped BiT ResNet (`bit_cifar10`) on the 128 shipped CIFAR-10 test
# images, and judges them as the report does: verdicts with 95% jackknife intervals over images, under two ways of
# reading a layer, each criterion checked on controls with a known answer.
#
# **Any two models**: set `MODEL_A` (read as "the ViT") and `MODEL_B` (read as "the ResNet") below, or the
# environment variables `VITLAB_MODEL_A` and `VITLAB_MODEL_B`, to a checkpoint folder or a timm name (the hub's
# weights need a connection once), e.g. `vit_base_patch16_224.augreg2_in21k_ft_in1k` against `resnet50.a1_in1k`. Each
# model gets the same images through its own preprocessing (for 224 px models: crops of scikit-learn's photos).

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL_A = os.environ.get("VITLAB_MODEL_A") or None  # None: the embedded default ViT
MODEL_B = os.environ.get("VITLAB_MODEL_B") or "../data/checkpoints/bit_cifar10"  # the shipped BiT ResNet
N_IMAGES = 16 if SMOKE else None  # None: all 128 shipped CIFAR-10 test images for 32 px models (16 photos otherwise)
BATCH_SIZE = 8 if SMOKE else 64  # images per mini-batch of the CKA estimator

# %%
import vitlab
from vitlab.base.intervals import fmt_value
from vitlab.data.images import default_data_words, default_images
from vitlab.figures.plots import notebook_figures, similarity_figure
from vitlab.findings import similarity as SF
from vitlab.findings.controls import validation_table
from vitlab.findings.explain import explain
from vitlab.findings.judge import model_label, similarity_pair
from vitlab.findings.verdict import verdict_table
from vitlab.inspect.cka import layer_names

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model_a = vitlab.load_model(MODEL_A)
model_b = vitlab.load_model(MODEL_B)
names, x_a, _ = default_images(model_a, N_IMAGES)
names_b, x_b, _ = default_images(model_b, len(names))  # the same images, through model b's own preprocessing
if names_b != names:
    raise ValueError(f"the two models' default images differ ({default_data_words(model_a, len(names))} against "
                     f"{default_data_words(model_b, len(names_b))}): name two models of the same input size")
name_a, name_b = model_label(model_a, MODEL_A), model_label(model_b, MODEL_B)
data = default_data_words(model_a, len(names))
tables, verdicts = similarity_pair(model_a, model_b, x_a, BATCH_SIZE, x_resnet=x_b,
                                   subject=f"{name_a} on {data} against {name_b}")
first = tables[SF.REPRESENTATION_CONVENTIONS[0]]
print(f"{name_a} ({len(layer_names(model_a))} layers) against {name_b} ({len(layer_names(model_b))} layers) on "
      f"{data}, batches of {min(BATCH_SIZE, len(names))}")

# %% [markdown]
# ## The CKA matrices
# Left: model a against itself; centre: model b against itself; right: model a's layers (rows) against model b's.
# Each layer read as every token (a ResNet stage: its whole feature map); `tables["patch_mean"]` holds the other
# reading.

# %%
similarity_figure(*first.cka(), layer_names(model_a), layer_names(model_b), vit=name_a, resnet=name_b,
                  subtitle=f"{len(names)} images, each layer read as "
                           f"{SF.REPRESENTATION_WORDS[first.representation]}")

# %%
for rep, t in tables.items():
    aa, bb, ab = t.cka()
    la, lb = aa.shape[0], bb.shape[0]
    rows = SF.lowest_quarter(la)
    print(f"{rep}: lower-to-upper-half CKA {fmt_value(float(SF.half_similarity(aa)))} (a) and "
          f"{fmt_value(float(SF.half_similarity(bb)))} (b); a's lowest {len(rows)} layer(s) against b's lower half "
          f"{fmt_value(float(ab[rows][:, SF.lower_half(lb)].mean()))}, upper half "
          f"{fmt_value(float(ab[rows][:, SF.upper_half(lb)].mean()))}")

# %% [markdown]
# ## The verdicts
# Each with its 95% jackknife interval over images; a verdict whose two readings of a layer disagree is inconclusive.
# Below them, each criterion on its controls (`vitlab.findings.controls.similarity_controls`): a positive control has the
# finding by construction and must be judged reproduced, a negative one must not.

# %%
print(verdict_table(verdicts))
print()
print(explain(verdicts, width=110))

# %%
for row in validation_table(verdicts):
    lo, hi = row["interval"]
    print(f"{row['key']:<20} {row['kind']:<9} {'passed' if row['passed'] else 'FAILED':<7} {row['observed']:<16} "
          f"{fmt_value(row['statistic'])} [{fmt_value(lo)}, {fmt_value(hi)}]  {row['control']}")
