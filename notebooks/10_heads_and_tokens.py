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
# # What the heads do and where attention goes: a causal head atlas and token diagnostics (beyond the paper)
# The paper's Fig. 7 (right) shows that some heads in the lowest layers attend locally and others globally; it does
# not say whether either kind matters for the prediction. The **head atlas** answers that causally: each head's
# output is replaced, one head at a time, by its mean over the images (mean ablation) or by zero (zero ablation),
# and the drop in the true class's log-probability is measured, with a 95% interval over images
# (`vitlab.head_importance`). Each head is drawn at its mean attention distance, so local and global heads can be
# compared directly.
#
# The **token diagnostics** look at the tokens that are not patches: how much attention goes to the class,
# distillation and register tokens (`vitlab.prefix_attention`), the norms of every token per layer with the
# high-norm outlier patches Darcet et al. 2024 ("Vision Transformers Need Registers") find in large ViTs trained long
# (`vitlab.token_norms`), and how much the mean attention distance and rollout results change when the prefix
# tokens are kept or removed. They run on the shipped default ViT (a class and a distillation token) and on a
# randomly initialised ViT of the same shape with register tokens.
#
# The images are the 128 shipped CIFAR-10 test images. The criteria are `vitlab.findings.atlas`'s, the same as the
# `vitlab reproduce` report's "heads" and "tokens" sections. In the explorer (`vitlab app`), the distance explorer's
# "head importance" button colours each head by the same mean-ablation drop.

# %% tags=["parameters"]
import os

SMOKE = os.environ.get("VITLAB_SMOKE") == "1"
N_IMAGES = 16 if SMOKE else None  # None: all 128 shipped CIFAR-10 test images
BATCH_SIZE = 8 if SMOKE else 32  # images per forward
REGISTERS = 4  # register tokens of the random-init model
SEED = 0  # the random-init model's weights

# %%
import torch
from IPython.display import display
from timm.models.vision_transformer import VisionTransformer

import vitlab
from vitlab.base.intervals import fmt_value
from vitlab.data.images import default_data_words, default_images, head_labels
from vitlab.figures.plots import head_atlas, layer_span, notebook_figures, prefix_share_heatmaps, token_norm_lines
from vitlab.findings import atlas as FA
from vitlab.findings.judge import distance_conventions, model_label
from vitlab.findings.model import DISTANCE_CONVENTIONS
from vitlab.inspect.distance import uniform_attention_distance
from vitlab.inspect.heads import ABLATIONS
from vitlab.inspect.tokens import norm_summary, rollout_prefix_change

notebook_figures()  # figures survive `jupyter nbconvert --to html`

model = vitlab.load_model()  # the embedded default
info = vitlab.model_info(model)
names, x, _ = default_images(model, N_IMAGES)
y = head_labels(model, len(names))  # the true classes: the sample's classes are the default's
if y is None:
    raise ValueError("the default images' classes are not the default model's: the head atlas needs true classes")
data = default_data_words(model, len(names))
name = model_label(model, None)
ceiling = uniform_attention_distance(info.grid_size, info.patch_size)  # px: the distance of uniform attention
conventions = distance_conventions(model, x, BATCH_SIZE)
distance = conventions[DISTANCE_CONVENTIONS[0]].mean(1)  # (L, H) px, the Fig. 7 right convention
L, H = distance.shape
print(f"{name}: {L} blocks x {H} heads, prefix tokens {', '.join(info.prefix_kinds)}; {data}; uniform attention "
      f"lies {ceiling:.1f} px away on average")

# %% [markdown]
# ## The head atlas
# One dot per head: its mean attention distance (x) against the drop in log p(true class) when it is ablated (y),
# with the 95% interval over images as an error bar. Squares and diamonds: the lowest layers' local and global
# heads (the nearer and the farther half of their heads by distance); circles: the heads above them.

# %%
atlas = {a: vitlab.head_importance(model, x, y, ablation=a, batch_size=BATCH_SIZE, progress=False)
         for a in ABLATIONS}
groups = FA.head_group_effects(atlas, distance)
head_atlas(distance.numpy(), {a: r.logprob_drop.numpy() for a, r in atlas.items()},
           {a: r.logprob_interval.numpy() for a, r in atlas.items()}, groups.codes.numpy(),
           f"Head importance against mean attention distance<br><sup>{data}; error bars: 95% interval over images; "
           f"lowest layers: {layer_span(1, groups.lowest)}</sup>")

# %%
mean = atlas["mean"]
print(f"Unablated accuracy on these images: {fmt_value(float(mean.base_correct.double().mean()))}; runs started at "
      f"the ablated block: {mean.shared}; intervals: {mean.interval_method}.")
for a, res in atlas.items():
    i, j = res.most_important()
    lo, hi = res.logprob_interval[i, j].tolist()
    above = int((res.logprob_interval[..., 0] > FA.MATTERS_NATS).sum())
    print(f"{a} ablation: most important head layer {i + 1}, head {j} ({float(distance[i, j]):.1f} px), drop "
          f"{fmt_value(float(res.logprob_drop[i, j]))} nats [{fmt_value(lo)}, {fmt_value(hi)}], accuracy drop "
          f"{fmt_value(float(res.accuracy_drop[i, j]))}; {above} of {L * H} heads have an interval above "
          f"{FA.MATTERS_NATS} nats")

# %% [markdown]
# ## Do the lowest layers' local heads matter, and the global ones?
# Each group's mean drop per head (one head ablated at a time) with its 95% interval over images, judged by the
# criterion below; then, per image, the local group's drop minus the global group's.

# %%
print(f"Criterion: {FA.GROUP_CRITERION}.\n")
for a, res in atlas.items():
    for kind, g in groups.effects[a].items():
        if g is None:
            print(f"{a} ablation, {kind} heads: none (one head in the lowest layers)")
            continue
        near, far = g.distance_px
        print(f"{a} ablation, {len(g.heads)} {kind} heads of {layer_span(1, groups.lowest)} ({near:.1f} to "
              f"{far:.1f} px, {fmt_value(near / ceiling)} to {fmt_value(far / ceiling)} of uniform attention): "
              f"{fmt_value(g.drop)} nats per head [{fmt_value(g.interval[0])}, {fmt_value(g.interval[1])}], "
              f"accuracy drop {fmt_value(g.accuracy_drop)} per head: {g.matters}")
    diff = FA.local_minus_global(res, groups.codes)
    if diff is not None:
        d, (lo, hi), how = diff
        side = ("the local heads matter more" if lo > 0 else "the global heads matter more" if hi < 0
                else "no difference decided")
        print(f"{a} ablation, local minus global: {fmt_value(d)} nats per head [{fmt_value(lo)}, {fmt_value(hi)}] "
              f"({how}): {side}\n")

# %% [markdown]
# ## Token diagnostics: the default and a random-init model with registers
# The random-init model has the default's shape (patch size, width, depth, heads) and `REGISTERS` register tokens
# after its class token; it sees the same preprocessed images. Random weights show what the architecture alone
# does, before any training: Darcet et al.'s outliers are a product of long training, so none are expected there.

# %%
torch.manual_seed(SEED)
registers = VisionTransformer(img_size=info.img_size, patch_size=info.patch_size, embed_dim=info.embed_dim,
                              depth=L, num_heads=H, reg_tokens=REGISTERS, num_classes=10).eval()
models = {name: model, f"random-init ViT with {REGISTERS} registers (seed {SEED})": registers}
tokens = {}
for label, net in models.items():
    net_info = vitlab.model_info(net)
    norms = vitlab.token_norms(net, x, batch_size=BATCH_SIZE, progress=False)
    verdict, rows = FA.outlier_layers(norms)
    tokens[label] = {
        "info": net_info, "share": vitlab.prefix_attention(net, x, batch_size=BATCH_SIZE, progress=False).cpu(),
        "norms": norms, "verdict": verdict, "rows": rows,
        "distance": FA.distance_convention_change(distance_conventions(net, x, BATCH_SIZE), ceiling),
        "rollout": FA.rollout_convention_change(rollout_prefix_change(net, x, batch_size=BATCH_SIZE))}
    print(f"{label}: prefix tokens {', '.join(net_info.prefix_kinds)}")

# %% [markdown]
# ### Attention on the prefix tokens
# The share of every query's attention that goes to each prefix token, per layer and head (mean over the images).
# Uniform attention would give each token 1 / T of it.

# %%
for label, t in tokens.items():
    share, kinds = t["share"], list(t["info"].prefix_kinds)
    display(prefix_share_heatmaps(share.numpy(), kinds, f"{label}: share of attention on each prefix token"
                                  f"<br><sup>all queries, mean over {data}</sup>"))
    per_layer = share.nansum(-1).mean(1)  # (L,) head mean of the share on all prefix tokens
    print(f"{label}: the {len(kinds)} prefix tokens take {fmt_value(float(per_layer[0]))} of the attention in layer "
          f"1, {fmt_value(float(per_layer.max()))} at most (layer {int(per_layer.argmax()) + 1}), "
          f"{fmt_value(float(per_layer[-1]))} in layer {len(per_layer)} (head means); uniform attention would give "
          f"them {fmt_value(len(kinds) / t['info'].num_tokens)}")

# %% [markdown]
# ### Token norms and high-norm outliers
# Per layer: the patches' median, 99th percentile and largest norm, each prefix token's mean norm, and (dashed) the
# outlier fence Q3 + 3 IQR of the layer's patch norms.

# %%
print(f"Criterion: {FA.OUTLIER_CRITERION}.\n")
for label, t in tokens.items():
    lines = {k: v.numpy() for k, v in norm_summary(t["norms"]).items()}
    display(token_norm_lines(lines, t["norms"].fences.numpy(), f"{label}: token norms per layer<br><sup>{data}; "
                             "dashed: the outlier fence</sup>"))
    top = max(t["rows"], key=lambda r: r["share"])
    present = [r["layer"] for r in t["rows"] if r["verdict"] == "present"]
    print(f"{label}: median patch norm {fmt_value(float(lines['patches: median'][0]))} in layer 1 and "
          f"{fmt_value(float(lines['patches: median'][-1]))} in layer {len(t['rows'])}; patches above their layer's "
          f"fence: {FA.fence_words(top)}. High-norm outliers: {t['verdict']}"
          + (f" (layers {', '.join(map(str, present))})" if present else ""))

# %% [markdown]
# ### How much the prefix convention changes the distance and rollout results
# Mean attention distance with the prefix tokens' share dropped (the convention of Fig. 7 right in the widely used
# code) against renormalised away; rollout of the readout with the prefix tokens kept in every layer's attention
# (vitlab's) against with their keys removed and each row renormalised over the patches.

# %%
for label, t in tokens.items():
    d, r = t["distance"], t["rollout"]

    def iv(stat: dict) -> str:
        return f"{fmt_value(stat['mean'])} [{fmt_value(stat['interval'][0])}, {fmt_value(stat['interval'][1])}]"

    print(f"{label}: the layers' head-mean distances change by at most {d['largest_layer_change_px']:.2f} px "
          f"(layer {d['largest_layer']}, {fmt_value(d['largest_layer_change_share'])} of uniform attention's "
          f"{ceiling:.1f} px), single heads by at most {d['largest_head_change_px']:.2f} px "
          f"({fmt_value(d['largest_head_change_share'])}). Rollout between the conventions: Spearman {iv(r['spearman'])}, "
          f"total-variation distance {iv(r['total_variation'])}; with the prefix kept, {iv(r['prefix_mass'])} of the "
          f"readout's rollout mass stays on the prefix tokens (95% intervals over images: {r['spearman']['method']})")
