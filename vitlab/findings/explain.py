"""The verdicts in words: one sentence per verdict that says no more than its numbers (``explain``), and where the
paper's finding does not show here, why that can be: a known reason with its source (``KNOWN_REASONS``), the
reason a verdict has no interval, or that the model measured is untrained.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from vitlab.base.intervals import fmt_value, n_units
from vitlab.findings.model import KEY_LOWEST_SPREAD
from vitlab.findings.verdict import Verdict, fmt_endpoint, fmt_threshold, runs_words

__all__ = ["explain", "known_reason", "reason_key", "no_interval_reason", "reason_lead", "KNOWN_REASONS",
           "UNTRAINED_REASON"]


#: Known reasons, with their sources, why a finding of the paper may not show on a small model trained on little
#: data; keyed by the figure part of ``Verdict.key`` (its leading dotted parts: ``fig7.left`` for
#: ``fig7.left.low_frequency``; ``reason_key``).
KNOWN_REASONS: dict[str, str] = {
    "fig7.left": "the paper's filters come from ViT-L/32 pre-trained on JFT-300M (section 4.5 shows them for "
                   "large-scale pre-training only); small patches leave few frequencies to order, and less "
                   "pre-training data shapes the filters less.",
    "fig7.centre": "the 2D topology of 1D position embeddings is learned from data; the paper's Appendix D.4 "
                     "finds that how positions are encoded matters little once there is a position embedding "
                     "(Table 8, on a grid of patches rather than pixels) and that the similarity pattern learned "
                     "depends on the training hyperparameters (Fig. 10); small grids trained briefly learn weak "
                     "structure.",
    "fig7.right": "Raghu et al. 2021 (\"Do Vision Transformers See Like Convolutional Neural Networks?\", "
                    "NeurIPS) find that ViTs trained on less data (ImageNet instead of JFT-300M) learn less local "
                    "attention in their lowest layers; the paper's Fig. 7 right is ViT-L/16 on JFT-300M.",
    "fig6": "the paper's maps are for ViT-L/16 on JFT-300M; Chefer et al. 2021 (\"Transformer Interpretability "
              "Beyond Attention Visualization\", CVPR) show that rollout is class-agnostic and can spread over the "
              "background.",
    "sec4_6": "the paper's MPP run is ViT-B/16 pre-trained on JFT-300M (Appendix B.1.2) and compared after "
                "fine-tuning on ImageNet.",
    "fig3_4": "the paper's crossing happens between ImageNet (1.3M images) and JFT-300M (Fig. 3, 4); a "
                "miniature of at most tens of thousands of 32 px images sits far below that regime, where "
                "convolutional inductive biases should win.",
    "fig3_4.locality": "Raghu et al. compare ViT-B and ViT-L with ResNet-50 and ResNet-152 at 224 px, pre-trained "
                         "on ImageNet or JFT-300M, and find that the ViT's lowest layers depend on the amount of "
                         "pre-training data: trained on ImageNet alone they learn less local attention than on "
                         "JFT-300M.",
}


#: what the compared models' features are read through, for the Sec. 4.6 verdicts: (kind, readout) -> sentence
_MPP_READOUT = {
    ("few_shot", "model"): "This few-shot probe reads the class token's output, which the MPP loss never trains.",
    ("few_shot", "patch_mean"): "This few-shot probe reads the mean of the patch tokens' outputs, which the MPP loss "
                                "does train (on corrupted inputs).",
}


#: the reason given with every verdict measured on a model whose weights are a random initialisation
#: (``vitlab.findings.model.untrained``)
UNTRAINED_REASON = ("this model's weights are a random initialisation (no pretrained weights): it has learned nothing, "
                    "so what its filters, position embeddings and attention show is chance, not what a trained ViT "
                    "learns.")


def no_interval_reason(v: Verdict) -> str | None:
    """Why ``v`` has no interval (e.g. "2 images, at least 16 needed"), None when it has one. Verdicts made before
    ``details["no_interval"]`` was recorded (or by hand) say only that none could be computed."""
    lo, hi = v.interval
    if math.isfinite(lo) and math.isfinite(hi):
        return None
    return v.details.get("no_interval") or "none could be computed"


def reason_key(key: str) -> str | None:
    """The ``KNOWN_REASONS`` entry of a verdict's ``key``: its longest leading run of dotted parts that is one
    (``fig7.left.low_frequency`` -> ``fig7.left``), None for none (and for ``""``, a record made before keys)."""
    parts = key.split(".") if key else []
    return next((k for n in range(len(parts), 0, -1) if (k := ".".join(parts[:n])) in KNOWN_REASONS), None)


def known_reason(v: Verdict) -> str | None:
    """The known reason (``KNOWN_REASONS``) shown with a verdict, None when none is known or when ``v`` has no
    interval: then the data decided nothing, and ``no_interval_reason`` says why instead. For the lowest layer's
    spread it starts with where this model's heads sit against the paper's, so the reason is read beside the numbers
    it explains (a model may have local heads and still fall short of the paper's span)."""
    if v.details.get("untrained"):
        return UNTRAINED_REASON
    if no_interval_reason(v) is not None:
        return None
    family = reason_key(v.key)
    if family is None:
        return None
    reason = KNOWN_REASONS[family]
    if family == "sec4_6":
        reason = " ".join([reason, *_mpp_sentences(v)])
    prefix = _filter_size(v) if family == "fig7.left" else _lowest_layer_heads(v) if v.key == KEY_LOWEST_SPREAD else None
    return f"{prefix} {reason[:1].upper()}{reason[1:]}" if prefix else reason  # the prefix ends a sentence


def _px(size: Any) -> str:
    """An image size from a config (32, or [32, 32]) in words: "32 px", "32x48 px"; "" when not recorded."""
    if isinstance(size, (int, float)):
        return f"{int(size)} px"
    if isinstance(size, (list, tuple)) and len(size) == 2:
        return f"{int(size[0])} px" if size[0] == size[1] else f"{int(size[0])}x{int(size[1])} px"
    return ""


def _mpp_sentences(v: Verdict) -> list[str]:
    """The Sec. 4.6 reason's sentences after the paper's setup, chosen by the comparison and the way its result
    went (a reason is shown only where the finding's side did not show): what this study compared, from the records
    (``details``), then what can hold back the side the finding expects ahead. MPP not ahead of scratch: the probe's
    readout (MPP never trains the class token). Supervised not ahead of MPP: the supervised side is one checkpoint,
    whose own data and budget, not only its objective, set its accuracy; a patch-mean probe reads what MPP trains."""
    d = v.details
    better, worse = d.get("better"), d.get("worse")  # None in records made before they were recorded
    kind, readout = d.get("kind"), d.get("readout")
    here = []
    pre = d.get("pretrain") or {}
    if pre.get("images") and pre.get("epochs"):
        px = _px(pre.get("image_px"))
        data = f" ({pre['data']})" if pre.get("data") else ""
        here.append(f"the MPP encoder was pre-trained on {int(pre['images']):,}{' ' + px if px else ''} images{data} "
                    f"for {n_units(int(pre['epochs']), 'epochs')}")
    fine = d.get("finetune") or {}
    if kind == "few_shot" and d.get("shots"):
        here.append(f"the initialisations are compared by a {d['shots']}-shot linear probe on frozen features, not "
                    "after fine-tuning")
    elif kind == "finetune" and fine.get("epochs") and fine.get("per_class"):
        here.append(f"the initialisations are compared after a {fine['epochs']}-epoch fine-tune on "
                    f"{int(fine['per_class']):,} labelled images per class")
    out = ["Here " + ", and ".join(here) + "."] if here else []
    if better == "mpp":  # MPP not shown ahead of `worse`
        out.append(_MPP_READOUT.get((kind, readout), ""))
    elif better == "supervised" and worse == "mpp":  # supervised not shown ahead of MPP
        ckpt = d.get("supervised_checkpoint")
        out.append(f"The supervised side is {f'the checkpoint {ckpt}' if ckpt else 'a single checkpoint'}: its "
                   "own data and training budget, not only its objective, set how well it does, where the paper "
                   "pre-trains both on JFT-300M.")
        if readout == "patch_mean":
            out.append(_MPP_READOUT[("few_shot", "patch_mean")])
    return [x for x in out if x]


def _filter_size(v: Verdict) -> str | None:
    """This model's patch size against the paper's 32 px, from ``details["patch_px"]`` (None when not recorded)."""
    patch = v.details.get("patch_px")
    if not patch or len(patch) != 2:
        return None
    p, q = (int(x) for x in patch)
    return (f"this model's filters are {p}x{q} px, {p * q:,} DCT frequencies per channel, where the paper's 32x32 px "
            "filters have 1,024.")


def _lowest_layer_heads(v: Verdict) -> str | None:
    """Where this model's lowest-layer heads sit against the paper's span, from the heads with a finite distance
    (``to_dict`` turns NaN into None); None without such heads or a finite ceiling."""
    heads, ceiling = v.details.get("head_distance_px") or [], v.details.get("ceiling_px")
    heads = [float(h) for h in heads if h is not None and math.isfinite(h)]
    if not heads or ceiling is None or not math.isfinite(ceiling) or ceiling <= 0:
        return None
    lo, hi = min(heads), max(heads)
    return (f"this model's lowest-layer heads sit at {lo:.1f} to {hi:.1f} px, {lo / ceiling:.0%} to "
            f"{hi / ceiling:.0%} of the uniform-attention distance, where the paper's lowest-layer heads span "
            "about 10% to 90%.")


def reason_lead(v: Verdict) -> str:
    """What a verdict that is not "reproduced" says before its known reason, so that the reason follows the verdict
    and never stands in for it: an estimate on the other side of the threshold from the paper's finding is said to
    be so (not "cannot decide")."""
    if v.verdict == "not reproduced":
        return "Not seen here"
    if _against(v):
        return ("The estimate lies on the other side of the threshold from the paper's finding, and the interval "
                "reaches the paper's side")
    return "The data cannot decide it here"


def _against(v: Verdict) -> bool:
    """Whether ``v``'s estimate lies on the other side of its threshold from the paper's finding."""
    if not math.isfinite(v.statistic):
        return False
    return v.statistic < v.threshold if v.side == ">" else v.statistic > v.threshold


def _qualified(v: Verdict) -> str:
    """The sentences a verdict's record adds to its numbers: every form of a convention it depends on, and the
    controls its criterion failed ("" when neither)."""
    out = ""
    if len(v.conventions) > 1 and v.qualifier and "convention" in v.qualifier:
        forms = "; ".join(f"{name}: {fmt_value(c['statistic'])} [{fmt_endpoint(_num(c['interval'][0]), v.threshold)}, "
                          f"{fmt_endpoint(_num(c['interval'][1]), v.threshold)}], {c['verdict']}"
                          for name, c in v.conventions.items())
        out += f" It differs between the forms of a convention ({forms})."
    if v.failed_controls:
        out += f" Its criterion fails the control(s): {', '.join(v.failed_controls)}."
    return out


def _num(x: Any) -> float:
    return math.nan if x is None else float(x)


def explain(verdicts: Sequence[Verdict], width: int | None = None) -> str:
    """One sentence per verdict, in words that follow from the numbers: what was judged (``subject``), what was
    found, with its unit and the training runs its interval covers, and, where the paper's finding does not show
    here, the known reason with its source. ``width``: wrap each to lines of at most that many
    characters, with a blank line between verdicts (for plain-text outputs such as a notebook's)."""
    lines = []
    for v in verdicts:
        lo, hi = v.interval
        t = v.threshold
        on = f" ({v.subject})" if v.subject else ""
        unit = f" {v.unit}" if v.unit else ""
        head = f"{v.finding}{on}: {v.label} ({v.quantity} {fmt_value(v.statistic)}{unit}, 95% interval " \
               f"[{fmt_endpoint(lo, t)}, {fmt_endpoint(hi, t)}] from {runs_words(v.n_runs)}, finding side {v.side} " \
               f"{fmt_threshold(t)})."
        head += _qualified(v)
        missing = no_interval_reason(v)
        if missing is not None:
            head += f" The data cannot decide it here; no interval: {missing}."
        elif v.verdict != "reproduced":
            reason = known_reason(v)
            what = reason_lead(v)
            head += f" {what}; known reason: {reason}" if reason else f" {what}."
        lines.append(head)
    if width is not None:
        import textwrap

        return "\n\n".join(textwrap.fill(line, width) for line in lines)
    return "\n".join(lines)
