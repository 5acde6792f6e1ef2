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
# # Few-shot linear probing (section 4.1)
# The paper's few-shot protocol: frozen features, whitened, a regularised least-squares fit to {-1, 1}^K
# targets in closed form. The paper reports 5 examples per class (Fig. 4); here 1/5/10/25, as the authors'
# big_vision evaluator, over several seeds.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default; or a timm ViT (online), e.g. the
# paper's own weights "vit_large_patch32_224.orig_in21k", or AugReg's "vit_base_patch16_224.augreg2_in21k_ft_in1k"
DATA = os.environ.get("VITLAB_PROBE_DATA", "shapes" if SMOKE else "cifar10")  # cifar10 (../shared or online), shapes

# %%
import vitlab
from vitlab.data.datasets import DataError, load_dataset, load_shapes, nested_subsets
from vitlab.data.images import trained_on
from vitlab.figures.plots import notebook_figures
from vitlab.probe.features import extract_features
from vitlab.probe.linear import few_shot_accuracy, format_table, linear_probe_accuracy

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model(MODEL)
probed = DATA
try:
    train, test = load_dataset(DATA, "train"), load_dataset(DATA, "test")
except (DataError, RuntimeError, OSError) as e:  # offline without CIFAR-10: the synthetic shapes
    print(f"{DATA} unavailable ({e}); probing on the synthetic shapes instead")
    train, test = load_shapes("train"), load_shapes("test")
    probed = "shapes"
n_train, n_test = (200, 200) if SMOKE else (5000, 2000)
n_all_train, n_all_test = len(train), len(test)
train = train.subset(nested_subsets(train.labels, [min(n_train, len(train))])[0])
test = test.subset(nested_subsets(test.labels, [min(n_test, len(test))])[0])
ftr, fte = extract_features(model, train), extract_features(model, test)
shots = (1, 5, 10) if SMOKE else (1, 5, 10, 25)
res = few_shot_accuracy(ftr, train.labels, fte, test.labels, shots=shots)
print(f"{MODEL or 'embedded default'} on {probed}: class-balanced subsets of {len(train):,} of its {n_all_train:,} "
      f"training and {len(test):,} of its {n_all_test:,} test images, {ftr.shape[1]}-d features (the 'all' row: "
      f"these {len(train):,} training images)")
print(format_table(res, linear_probe_accuracy(ftr, train.labels, fte, test.labels)))
# what the table measures follows from what was probed: the fallback to the shapes changes it
name, seen = MODEL or "the embedded default", trained_on(model)
if probed == seen:
    print(f"what the table measures: separability. {name} was trained on these {probed} classes, so the table says "
          "how linearly separable its features are, not how they transfer (notebook 06 measures transfer)")
else:
    print(f"what the table measures: transfer. {name} was trained on {seen or 'its own pre-training data'}, not on "
          f"{probed}" + ("; the synthetic shapes stood in for the unreadable " + DATA + ", a task far from the "
                         "paper's" if probed != DATA else ""))

# %% [markdown]
# **Paper:** the paper reports fine-tuning accuracy mainly and uses linear few-shot accuracy for quick on-the-fly
# evaluation where fine-tuning would be too costly (section 4.1); Fig. 4 compares ViTs and ResNets pre-trained on
# subsets of JFT-300M by their linear 5-shot ImageNet accuracy.
# **Here:** the table above for the chosen model, and the line under it says what it measures: separability where
# the model was trained on the probed classes (the embedded default on CIFAR-10), transfer otherwise (a timm model
# on CIFAR-10, or any model on the synthetic shapes, which stand in when CIFAR-10 is not readable here).
