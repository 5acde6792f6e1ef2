"""A model's facts in words. ``model_facts``: what a loaded model is (architecture, parameters, input, positions),
where its weights came from (``weights_description``) and its card's headline, the rows that ``vitlab info``, the
report and the notebooks show. ``card_text``: a shipped model's card, ``MODEL_CARD.md``, written from the facts
``vitlab.train.export`` measured on the exported weights (``card.json``): the headline number and how it was measured,
the training time over every warm-started leg, the configuration and the per-epoch metrics. Text only, measuring
nothing: every number comes from the model itself, those facts, the run's configuration and epoch history, or the
model's preprocessing config.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from torch import nn

from vitlab.base.intervals import n_units
from vitlab.base.shipped import data_name
from vitlab.models.checkpoint import card_line, card_metric, model_card
from vitlab.models.info import ModelInfo, architecture_words, attention_position_words

__all__ = ["card_text", "card_series", "model_facts", "facts_text", "weights_description", "random_weights"]


def random_weights(net: nn.Module, model: Any, pretrained: bool, weights: str | os.PathLike | None) -> bool:
    """Whether ``net`` (loaded by ``vitlab.load_model(model, pretrained=, weights=)``) has random weights: a timm name
    with ``pretrained=False``, or a config (``load_model`` builds it freshly initialised); a checkpoint or a weights
    file has saved ones."""
    if getattr(net, "vitlab_checkpoint", {}).get("path") or weights:
        return False
    return not pretrained or not (model is None or isinstance(model, (str, os.PathLike)))


def weights_description(net: nn.Module, model: Any, pretrained: bool, weights: str | os.PathLike | None) -> str:
    """Where the weights of ``net`` (loaded by ``vitlab.load_model(model, pretrained=, weights=)``) came from, in the
    one wording vitlab uses: a checkpoint (a shipped one by its name in the checkout, ``data/...``, also from a
    wheel; the user's own as given), "FILE (local file)", "HUB_ID (hub)" or "pretrained (timm)", or "random
    initialisation (no pretrained weights)"."""
    ck = getattr(net, "vitlab_checkpoint", {}).get("path")
    if ck:
        repo = Path(__file__).resolve().parents[1]
        inside = Path(ck).resolve().is_relative_to(repo)
        return data_name(ck) or (Path(ck).resolve().relative_to(repo).as_posix() if inside else str(ck))
    if weights:
        return f"{weights} (local file)"
    if random_weights(net, model, pretrained, weights) or model is None:
        return "random initialisation (no pretrained weights)"
    hub = net.pretrained_cfg.get("hf_hub_id") or net.pretrained_cfg.get("tag")
    return f"{hub} (hub)" if hub else "pretrained (timm)"


def _positions(info: ModelInfo) -> str:
    """Where the model learns positions, as words: its position-embedding table and what its attention adds (a
    ConViT's gated positional self-attention, with the layers it runs in)."""
    table = {"learn": "a learned position-embedding table", "fixed": "a fixed position-embedding table (e.g. sin-cos)",
             "none": "no position-embedding table"}.get(info.pos_embed, f"position embedding {info.pos_embed}")
    how = attention_position_words(info)
    if info.gpsa_depth:
        from vitlab.figures.plots import layer_span  # plotly: only for a ConViT

        how += f" in {layer_span(1, info.gpsa_depth)}"
    return f"{table}; its attention adds {how}" if how else table


def model_facts(net: nn.Module, info: ModelInfo | None, model: Any = None, pretrained: bool = True,
                weights: str | os.PathLike | None = None) -> list[tuple[str, str]]:
    """A loaded model's facts in words, as ``(name, words)`` rows in order: model, architecture, parameters, input
    and positions (for a ViT: ``info`` is its ``model_info``; None for a model without tokens, e.g. a CNN), weights
    (``weights_description``) and, for a shipped checkpoint, its card's headline (``card_line``). ``model``,
    ``pretrained`` and ``weights`` are what ``vitlab.load_model`` was given."""
    params = sum(p.numel() for p in net.parameters())
    rows = [("model", str(model or "embedded default"))]
    if info is None:
        rows += [("architecture", type(net).__name__), ("parameters", f"{params:,}")]
    else:
        ph, pw = info.patch_size
        patches = f"{ph}x{pw} px" if ph != pw else f"{ph} px"
        patches = f"{patches} per patch (the ResNet's stride)" if info.hybrid else f"{patches} patches"
        joins = f", joins at layer {info.class_token_joins + 1}" if info.class_token_joins else ""  # a ConViT's
        prefix = (f"{n_units(info.num_prefix_tokens, 'prefix tokens')} ({', '.join(info.prefix_kinds)}{joins})"
                  if info.num_prefix_tokens else "no prefix tokens")
        rows += [("architecture", f"{architecture_words(net, info)}: "
                                  f"{'hybrid, ResNet features as patches; ' if info.hybrid else ''}"
                                  f"{n_units(info.depth, 'blocks')}, width {info.embed_dim}, "
                                  f"{n_units(info.num_heads, 'heads')}"),
                 ("parameters", f"{params:,}"),
                 ("input", f"{info.img_size[0]}x{info.img_size[1]} px, {patches}, "
                           f"{info.grid_size[0]}x{info.grid_size[1]} grid, {prefix}, readout {info.readout}"),
                 ("positions", _positions(info))]
    rows.append(("weights", weights_description(net, model, pretrained, weights)))
    card = model_card(net)
    if card is not None:
        rows.append(("model card", card_line(card)))
    return rows


def facts_text(rows: list[tuple[str, str]]) -> str:
    """``model_facts`` rows as aligned lines, "name  words", as ``vitlab info`` and the notebooks print them."""
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)


def card_series(facts: dict) -> tuple[str, Callable[[dict], float | None], float | None, bool]:
    """What the learning curve and the per-epoch table show: (name, its value in a metrics.jsonl line, the shipped
    model's value, whether it is a fraction). Test accuracy; for an MPP run the masked-patch accuracy, or for its l2
    target (no accuracy) the masked-patch loss."""
    metric, final = card_metric(facts)
    if facts.get("objective") != "mpp":
        return metric, lambda h: h.get("test_accuracy"), final, True
    key = "accuracy" if final is not None else "loss"
    if key == "loss":
        metric, final = "masked-patch loss", facts["mpp_test"]["loss"]
    return metric, lambda h: (h.get("mpp_test") or {}).get(key), final, key == "accuracy"


def _init_words(model_cfg: dict) -> str:
    """How a fresh ViT's attention started (``ViTConfig.init``; a hybrid's under ``vit``), in words: "" for timm's."""
    init = (model_cfg.get("vit") or model_cfg).get("init", "timm")
    words = {"mimetic": "mimetic attention, `vitlab.models.mimetic`",
             "mimetic_qk": "mimetic query-key products, `vitlab.models.mimetic`"}
    return f" ({words[init]})" if init in words else ""


def card_text(f: dict, train_cfg: dict, history: list[dict], model: nn.Module) -> str:
    """``MODEL_CARD.md`` from the export's facts ``f`` (``card.json``), the run's ``train_cfg`` and epoch ``history``,
    and the shipped ``model`` (its preprocessing)."""
    pc = model.pretrained_cfg
    metric, value, _, _ = card_series(f)
    mpp = f.get("objective") == "mpp"
    rows = "\n".join(f"| {h['epoch']} | {h['train_loss']:.4f} | "
                     f"{value(h) if value(h) is not None else float('nan'):.4f} | "
                     f"{h.get('images_per_second', '')} |" for h in history)
    done = f["epochs_done"] == f["epochs_planned"]
    title, lead = _mpp_lead(f, train_cfg) if mpp else _accuracy_lead(f, train_cfg)
    teacher_line = (f"; distilled ({f['distill']} targets) from the teacher `{f['teacher']}`" if f.get("teacher")
                    else "")
    wall = (f"{f['train_seconds']:.0f} s" if f.get("train_seconds") is not None
            else "not recorded (the run's checkpoint has no train_seconds)")
    lineage = _lineage_section(f.get("lineage") or [])
    return f"""# Model card: {title}

{lead}
* Training time: {f['train_hours']:.2f} h of wall clock, evaluations included{_start_line(f, train_cfg)}{teacher_line}.
* Learning curve: `learning_curve.png` ({metric} against training hours; {f['learning_curve']}).
* Command: `{f['command']}`
* Epochs: {f['epochs_done']} of {f['epochs_planned']} planned{'' if done else ' (the run is not finished; it resumes with --resume)'}.
{_recipe_line(f)}* Training wall time: {wall} on {f['hardware']}{_compiled_note(f, history)}.
* Data: {_data_line(f.get('data'))}.
* Parameters: {f['parameters']:,}; file: {f['file_bytes'] / 1e6:.1f} MB ({f['dtype']}).
* Preprocessing (from the model's pretrained config): input {tuple(pc['input_size'])}, mean {tuple(pc['mean'])},
  std {tuple(pc['std'])}, interpolation {pc['interpolation']}, crop_pct {pc['crop_pct']}.
* Versions: {_versions_line(f)}.

Load it with `vitlab.load_model("{f['path']}")`{' or `vitlab.load_model()` (it is the embedded default)' if f['is_default'] else ''}.
{lineage}
## Training configuration

```json
{json.dumps(train_cfg, indent=2)}
```

## Per-epoch metrics ({metric} measured in {f['training_precision']} during training{f" on {f['curve_images_short']}" if mpp else ''})

| epoch | train loss | {metric} | images/s |
|---|---|---|---|
{rows}
"""


def _accuracy_lead(f: dict, train_cfg: dict) -> tuple[str, str]:
    """``(title, lead)`` of a classifier's card: what it was trained on (and distilled from), its test accuracy as
    measured on export, with test-time augmentation and its heads against the teacher where measured."""
    title = f"{train_cfg['model']['kind']} trained on {train_cfg['data']}" + (
        f", distilled from `{f['teacher']}`" if f.get("teacher") else "")  # said first: a teacher shapes what it learns
    lines_below = (f"\n* With test-time augmentation (level {f['tta_level']}: mirror"
                   f"{' and 1 px shifts' if f['tta_level'] == 2 else ''}): **{f['test_accuracy_tta']:.2%}**."
                   if f.get("test_accuracy_tta") is not None else "") + _distillation_line(f.get("distillation"))
    lead = f"""* **Test accuracy: {f['test_accuracy']:.2%}** on all {f['test_images']:,} images of the {f['test_split']}
  split ({f['dtype']} weights as shipped, through `timm.data.resolve_data_config({{}}, model=model)` and
  `timm.data.create_transform(**cfg)`).{lines_below}"""
    return title, lead


def _distillation_line(dist: dict | None) -> str:
    """The card's line on a distilled model's heads against its teacher (``vitlab.train.export.distillation_facts``:
    shares in [0, 1], or ``missing`` with the reason); empty for a model without a teacher."""
    if not dist:
        return ""
    if "missing" in dist:
        return f"\n* Its heads against the teacher: not measured, {dist['missing']}."
    return (f"\n* Its two heads alone: class token {dist['class_head']:.2%}, distillation token "
            f"{dist['distillation_head']:.2%} (the readout averages their logits). The teacher scores "
            f"{dist['teacher']:.2%} through its own transform; the readout takes the teacher's decision "
            f"on {dist['readout_agrees_with_teacher']:.2%} of the images, the distillation head on "
            f"{dist['distillation_head_agrees_with_teacher']:.2%}."
            + (f" Where the teacher is wrong the readout is right on "
               f"{dist['readout_where_teacher_wrong']:.2%} of the images; "
               if dist.get("readout_where_teacher_wrong") is not None else " ")
            + (f"{dist['readout_errors_shared_with_teacher']:.2%} of the readout's errors are the "
               "teacher's own (the same wrong class)"
               if dist.get("readout_errors_shared_with_teacher") is not None else "the readout makes no errors")
            + " (`vitlab.train.export.distillation_facts`).")


def _mpp_lead(f: dict, train_cfg: dict) -> tuple[str, str]:
    """``(title, lead)`` of an encoder pre-trained by masked patch prediction: its masked-patch accuracy and loss as
    measured on export, and how to load the encoder and its prediction head."""
    m = f["mpp_test"]
    chance = {"color3": " (chance 0.20%)", "patch4x4": " (per 4 x 4 sub-patch colour; chance 0.20%)"}.get(
        f["mpp_target"], "")
    score = f"**Masked-patch accuracy: {m['accuracy']:.2%}**{chance}, " if "accuracy" in m else ""
    what = {"color3": "3-bit mean colour", "patch4x4": "4 x 4 downsized patch in 3-bit colours",
            "l2": "pixels (squared error)"}[f["mpp_target"]]
    title = f"{train_cfg['model']['kind']} encoder pre-trained by masked patch prediction on {train_cfg['data']}"
    lead = f"""* {score}loss {m['loss']:.4f}: the {what} of the corrupted patches, predicted from their output tokens,
  on all {f['mpp_test_images']:,} images of the {f['test_split']} split with one fixed corruption draw (seed 0, batches
  of 250 in split order: `vitlab.train.loop.evaluate_mpp`'s defaults; {f['mpp_rate']:.0%} of patches corrupted), from the
  {f['dtype']} weights as shipped.
* **Self-supervised**: labels were never read, so the classification head is untrained and the card reports no
  test accuracy. `vitlab.load_model(path)` gives the encoder (with that head: replace or fine-tune it; a warm start
  through `--set init_from=...` leaves it fresh); `vitlab.train.mpp.load_mpp(path)` gives the encoder and the prediction
  head (`objective.safetensors`). The learning curve's points are the evaluations during training, in
  {f['training_precision']}, on {f['curve_images']}."""
    return title, lead


def _start_line(f: dict, train_cfg: dict) -> str:
    """How the run started (warm-started from a checkpoint, else from random initialisation as its model's config
    says) and, over every warm-started leg, the training time in all."""
    start = (f"the checkpoint `{f['warm_start_from']}` held before this export replaced it"
             if f.get("warm_start_from") == f.get("path") else f"`{f['warm_start_from']}`")
    line = (f", warm-started with a fresh schedule from {start}" if f.get("warm_start_from")
            else ", from random initialisation" + _init_words(train_cfg.get("model") or {}))
    if f.get("total_train_hours") is not None:
        was = (f", {f['warm_start_test_accuracy']:.2%} test accuracy" if f.get("warm_start_test_accuracy") is not None
               else "")
        line += f" (which had trained {f['warm_start_hours']:.2f} h{was}): **{f['total_train_hours']:.2f} h in all**"
    return line


def _recipe_line(f: dict) -> str:
    """The card's line on a seed of a recipe (``vitlab.train.export.export_recipe``): the recipe and seed, whether its
    schedule is the full one, and where the emergence records are; empty for any other model."""
    if not f.get("recipe"):
        return ""
    full = f.get("full_epochs")
    if full is None:
        schedule = "the full schedule was not stated at export"
    elif f.get("shortened"):
        schedule = f"**a shortened schedule**: {f['epochs_planned']} of the full recipe's {full} epochs"
    else:
        schedule = f"the full schedule of {full} epochs"
    n = len(f.get("emergence") or [])
    return (f"* Recipe `{f['recipe']}`, seed {f['seed']}: {schedule}. `card.json` holds the run's per-epoch history "
            f"(`history`) and the paper's Fig. 7 statistics of its {n} snapshots (`emergence`, from "
            "`vitlab.train.emergence.snapshot_history`).\n")


def _compiled_note(f: dict, history: list[dict]) -> str:
    """How many of the epochs trained through ``torch.compile`` (``vitlab.train.loop``'s ``compile``), when any did."""
    n = f.get("compiled_epochs") or 0
    return f"; the training step compiled by `torch.compile` in {n} of {len(history)} epochs" if n else ""


def _data_line(data: dict | None) -> str:
    """The card's data line from the run's record (``{"train", "test", "train_examples", "classes",
    "validation_images"}``, each optional): sentences, not the dict's repr. With ``validation_images`` the run chose
    on a validation split and read the test split once, after its last epoch."""
    if not data:
        return "not recorded by the run"
    parts = []
    if data.get("train"):
        n = data.get("train_examples")
        parts.append(f"trained on `{data['train']}`" + (f" ({n:,} images)" if isinstance(n, int) else ""))
    n_val = data.get("validation_images")
    if n_val:
        parts.append(f"validated during training on {n_val:,} images held out of the training split")
    if data.get("test"):
        parts.append(f"tested once, after the last epoch, on `{data['test']}`" if n_val else
                     f"evaluated during training on `{data['test']}`")
    if data.get("classes"):
        parts.append(f"{len(data['classes'])} classes ({', '.join(map(str, data['classes']))})")
    rest = {k: v for k, v in data.items() if k not in ("train", "test", "train_examples", "classes",
                                                       "validation_images")}
    parts += [f"{k}: {v}" for k, v in rest.items()]
    return "; ".join(parts)


def _versions_line(f: dict) -> str:
    """The torch and timm a model was exported (and measured) with, and those it trained with where they differ and
    the run recorded them (a model trained on another machine, e.g. an accelerator's image)."""
    v, t = f["versions"], f.get("train_versions") or {}
    line = f"torch {v['torch']}, timm {v['timm']}"
    if t.get("torch") and (t.get("torch"), t.get("timm")) != (v["torch"], v["timm"]):
        line = f"trained with torch {t['torch']}, timm {t.get('timm') or '?'}; exported and measured with {line}"
    return line


def _lineage_section(lineage: list[dict]) -> str:
    """The card's table of every leg of a model trained over several warm starts (empty for a single leg): where
    each ended in cumulative hours and what it shipped, from the cards of the checkpoints it started from."""
    if len(lineage) < 2:
        return ""

    def cell(v, fmt: str) -> str:
        return "?" if v is None else format(v, fmt)

    rows = "\n".join(f"| {i} | {cell(leg['epochs_done'], 'd')} | {cell(leg['train_hours'], '.3f')} | "
                     f"{cell(leg['total_train_hours'], '.3f')} | {cell(leg['test_accuracy'], '.2%')} | "
                     f"{leg['hardware'] or '?'} | {f'`{c}`' if (c := leg['command']) else '?'} |"
                     for i, leg in enumerate(lineage, 1))
    return f"""
## Lineage: every leg of its training

Each leg after the first warm-started from the model the leg before it shipped, with a fresh schedule; the last leg
is this card's. Hours are wall clock as each leg's card recorded them; "?" is what a card did not record (an MPP
encoder has no test accuracy). The learning curve draws the earlier legs' shipped models.

| leg | epochs | hours | hours in all | test accuracy as shipped | machine | command |
|---|---|---|---|---|---|---|
{rows}
"""
