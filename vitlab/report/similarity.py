"""The report's representation-similarity section (Raghu et al. 2021, beyond the paper): linear CKA of the model
against itself, of the shipped ResNet (``bit_cifar10``) against itself and of the two against each other on the
report's images, with the verdicts of ``vitlab.findings.similarity`` checked on their controls.

``vitlab.findings.judge.similarity_pair`` measures (the one way the report and notebook 09 measure it); ``similarity`` builds the section.
Every sentence is formatted from the numbers computed here.
"""

from __future__ import annotations

from typing import Any

from vitlab.base.intervals import fmt_value, n_units
from vitlab.base.shipped import data_path
from vitlab.figures.plots import similarity_figure
from vitlab.findings import similarity as SF
from vitlab.findings.judge import similarity_pair
from vitlab.findings.verdict import Verdict
from vitlab.inspect.cka import layer_names
from vitlab.models.info import AnyModel, data_config, resolve_model
from vitlab.models.load import load_model
from vitlab.report.sections import Inputs, Section

__all__ = ["similarity", "RESNET_CHECKPOINT", "SIMILARITY_TITLE",
           "SIMILARITY_FINDING"]

#: the ResNet the report's model is compared with
RESNET_CHECKPOINT = data_path("checkpoints/bit_cifar10")
SIMILARITY_TITLE = "Representation similarity: the ViT against a ResNet (Raghu et al. 2021, our addition)"
#: what the section judges, as the verdict table names it when it was not judged
SIMILARITY_FINDING = "Raghu et al. 2021: ViT and ResNet representations compared by CKA"
PAPER = ("Raghu et al. 2021 (\"Do Vision Transformers See Like Convolutional Neural Networks?\", NeurIPS), Fig. 1 "
         "and 2, by linear CKA between layers: a ViT's representations are much more uniform across depth than a "
         "ResNet's, with strong similarity between its lower and higher layers; the lower half of the ResNet's "
         "layers is similar to about the lowest quarter of the ViT's.")


def _why_not(inp: Inputs, resnet: AnyModel) -> str | None:
    """Why the pair cannot be compared on the report's images, None when it can."""
    need = 5  # the jackknife leaves one image out of a batch: the unbiased estimator keeps its 4
    if len(inp.x) < need:
        return f"the report has {n_units(len(inp.x), 'images')}; CKA with its jackknife needs at least {need}"
    mine, theirs = data_config(inp.net), data_config(resnet)
    if (mine["input_size"], tuple(mine["mean"]), tuple(mine["std"])) != (
            theirs["input_size"], tuple(theirs["mean"]), tuple(theirs["std"])):
        return (f"the ResNet reads {theirs['input_size'][-1]} px images normalised by mean {tuple(theirs['mean'])}, "
                f"this model {mine['input_size'][-1]} px by mean {tuple(mine['mean'])}, so they are not shown the "
                "same images; notebook 09 compares any two models")
    return None


def _ours(v_uni: Verdict, v_low: Verdict, n: int) -> str:
    """The section's sentences, from the verdicts' numbers."""
    d, e = v_uni.details, v_low.details
    other = [name for name in v_uni.conventions if name != d["convention"]]
    alt = ""
    if other:
        cu, cl = v_uni.conventions[other[0]], v_low.conventions[other[0]]
        alt = (f" Each layer read as {other[0]} instead: the uniformity difference is {fmt_value(cu['statistic'])} "
               f"({cu['verdict']}) and the lower-half contrast {fmt_value(cl['statistic'])} ({cl['verdict']}).")
    return (f"On {n_units(n, 'images')}, each layer read as {d['convention']}: the mean CKA between the lower- "
            f"and upper-half layers is {fmt_value(d['vit_half_cka'])} for the ViT ({n_units(d['vit_layers'], 'layers')})"
            f" and {fmt_value(d['resnet_half_cka'])} for the ResNet ({n_units(d['resnet_layers'], 'layers')}), a "
            f"difference of {fmt_value(v_uni.statistic)}. The ViT's lowest {n_units(len(e['vit_rows']), 'layers')} "
            f"against the ResNet's lower half: CKA {fmt_value(e['lower_half_cka'])}; against its upper half: "
            f"{fmt_value(e['upper_half_cka'])}." + alt)


def similarity(inp: Inputs, resnet: AnyModel | None = None, resnet_name: str = "bit_cifar10 (shipped)",
               batch_size: int = 64) -> Section:
    """The section for the report's model against ``resnet`` (default: the shipped ``bit_cifar10``, loaded on the
    images' device) on the report's images; where the two cannot be shown the same images, a section that says why,
    with the finding listed as not judged."""
    stamp = {**inp.stamp(), "resnet": resnet_name}
    if resnet is None and not (RESNET_CHECKPOINT / "model.safetensors").is_file():
        why = f"the shipped ResNet is not here ({RESNET_CHECKPOINT}: a checkout's data/ holds it, a wheel does not)"
        return Section("similarity", SIMILARITY_TITLE, None, PAPER, f"Not computed: {why}.", stamp,
                       not_judged=[(SIMILARITY_FINDING, why)])
    if resnet is None:
        resnet = load_model(str(RESNET_CHECKPOINT)).to(inp.x.device)
    resnet = resolve_model(resnet)  # once, for the CKA pair and the layer names
    resnet.module.eval()
    why = _why_not(inp, resnet)
    if why is not None:
        return Section("similarity", SIMILARITY_TITLE, None, PAPER, f"Not computed: {why}.", stamp,
                       not_judged=[(SIMILARITY_FINDING, why)])
    tables, judged = similarity_pair(inp.model, resnet, inp.x, batch_size,
                                     subject=f"{inp.subject()} against {resnet_name}")
    first = tables[SF.REPRESENTATION_CONVENTIONS[0]]
    v_uni, v_low = (next(v for v in judged if v.key == k) for k in SF.KEYS)
    subtitle = (f"{n_units(len(inp.x), 'images')}, each layer read as {SF.REPRESENTATION_WORDS[first.representation]}; mini-batch "
                f"unbiased CKA, batches of {min(batch_size, len(inp.x))}")
    fig = similarity_figure(*first.cka(), layer_names(inp.model), layer_names(resnet), subtitle=subtitle)
    metrics: dict[str, Any] = {rep: dict(zip(("vit_vit", "resnet_resnet", "vit_resnet"),
                                             (m.tolist() for m in t.cka()))) for rep, t in tables.items()}
    stamp["settings"] = {"compared_with": resnet_name, "representations": list(tables), "batch_size": batch_size,
                         "estimator": "unbiased HSIC", "interval": "jackknife over images"}
    if inp.untrained:  # random weights: what they show is chance, not what a ViT learns
        from vitlab.findings.model import untrained

        judged = [untrained(v) for v in judged]
    return Section("similarity", SIMILARITY_TITLE, fig, PAPER, _ours(v_uni, v_low, len(inp.x)), stamp, judged,
                   {"cka": metrics, "layers": {"vit": layer_names(inp.model), "resnet": layer_names(resnet)}})
