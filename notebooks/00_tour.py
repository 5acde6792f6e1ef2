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
# # A tour of vitlab
#
# vitlab looks inside Vision Transformers the way Dosovitskiy et al. do in "An Image is Worth 16x16 Words"
# (ICLR 2021). This tour loads a model, captures its attention and opens the interactive explorers. The
# following notebooks take one experiment of the paper each.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"  # quick run for the test suite
MODEL = os.environ.get("VITLAB_MODEL") or None  # None: the embedded default; or a timm ViT (online), e.g.
# the paper's own weights "vit_large_patch32_224.orig_in21k" / "vit_base_patch16_224.orig_in21k" (no classifier
# head: no predicted class, attention and rollout only), or AugReg's "vit_base_patch16_224.augreg2_in21k_ft_in1k"

# %%
import vitlab
from vitlab.data.images import default_images
from vitlab.figures.plots import notebook_figures
from vitlab.models.card import facts_text, model_facts

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model(MODEL)
info = vitlab.model_info(model)
card = vitlab.models.checkpoint.model_card(model)  # the shipped checkpoint's card: accuracy measured on export
print(facts_text(model_facts(model, info, MODEL)))  # as `vitlab info` and the report word them
info

# %% [markdown]
# `model_info` reads the grid, patch size, prefix tokens and readout from the model itself. Attention maps
# come out as one tensor `(layers, images, heads, tokens, tokens)`, exact post-softmax values:

# %%
names, x, shown = default_images(model, 4 if SMOKE else 8)
maps = vitlab.attention_maps(model, x)
print(tuple(maps.shape), "rows sum to", float(maps[0, 0, 0, 0].sum()))

# %% [markdown]
# ## The explorers
# Pick an image (or upload one), a layer, a head or a fusion of heads, and a method; click a patch to make it
# the query. Hover a dot of the distance plot for its layer and head, click it to open that head above.

# %%
from vitlab.app.widgets import explorers

attention, positions, distance = explorers(model, (names, x, shown))
attention

# %%
positions

# %%
distance

# %% [markdown]
# **Paper vs. here.** The paper's figures are for ViT-L at 224 px trained on JFT-300M; the embedded default is a
# small ViT trained on CIFAR-10 at 32 px, with a teacher (the cell below prints its size, training time and teacher
# from its model card), so expect the same kinds of structure, weaker. The notebooks that follow set each figure
# beside the paper's statement.

# %%
if card is not None:  # what the model card records, not typed here
    hours = card.get("total_train_hours", card.get("train_hours"))
    legs = len(card.get("lineage") or []) or 1
    said = (f"{card['path']}: {card['parameters'] / 1e6:.1f} M parameters, trained on {card['data']['train']} "
            f"({card['data']['train_examples']:,} images) at {model.pretrained_cfg['input_size'][-1]} px, "
            f"{hours:.1f} h in {legs} leg(s)")
    if card.get("teacher"):
        teacher_acc = (card.get("distillation") or {}).get("teacher")
        said += (f"; its last leg distilled ({card.get('distill')} targets, through its distillation token) from the "
                 f"teacher {card['teacher']}" + (f" ({teacher_acc:.2%} test accuracy)" if teacher_acc else ""))
    print(said)
else:
    print(f"{MODEL}: no vitlab model card (a timm model or a run checkpoint)")
