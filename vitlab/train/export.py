"""Ship a trained run: a half-precision checkpoint plus a model card whose accuracy is measured on export.

The accuracy on the card is computed from the exported (half-precision) weights, fed through the transform
that ``timm.data.resolve_data_config({}, model=model)`` gives, so anyone loading the checkpoint the
documented way reproduces it. Here: the measuring (``timm_pipeline_accuracy``; for a distilled ViT
``distillation_facts``, its heads against its teacher), the card's facts (``card.json``, with the training time over
every warm-started leg) and its learning curve; the card's text is written by ``vitlab.models.card``.
"""

from __future__ import annotations

import copy
import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np
import timm
import torch
from PIL import Image
from torch import Tensor, nn

from vitlab.base.atomic import disk_full_named, replace_dir, rmtree_quiet, temp_dir_beside
from vitlab.base.checks import check_count
from vitlab.base.provenance import cpu_model, usable_cores, versions
from vitlab.data.datasets import ImageArray, base_dataset, load_dataset, portable_source
from vitlab.models.card import card_series, card_text
from vitlab.models.checkpoint import (
    RUN_ID,
    check_replaceable,
    load_checkpoint,
    resolve_folder,
    save_checkpoint,
)
from vitlab.train.distill import load_teacher
from vitlab.train.history import run_history, run_hours, training_curve
from vitlab.train.mpp import load_mpp

CARD_NAME = "MODEL_CARD.md"


def _timm_inputs(model: nn.Module) -> Callable[[Tensor], Tensor]:
    """``model``'s own timm eval transform, built once, as a batch function: (B, H, W, 3) uint8 -> (B, 3, h, w),
    each image transformed as a PIL image."""
    tf = timm.data.create_transform(**timm.data.resolve_data_config({}, model=model))
    return lambda images: torch.stack([tf(Image.fromarray(np.ascontiguousarray(a))) for a in images.numpy()])


def _float_copy(model: nn.Module) -> nn.Module:
    """A float32 copy of ``model`` in eval mode, on its device; ``model`` itself is left as it was."""
    return copy.deepcopy(model).float().eval()


@torch.no_grad()
def timm_pipeline_accuracy(model: nn.Module, data: ImageArray, batch_size: int = 500, progress: bool = True) -> float:
    """Top-1 accuracy with the model's own timm eval transform applied to each image as a PIL image; ``progress``:
    a progress bar over the batches."""
    from tqdm.auto import tqdm

    check_count("batch_size", batch_size)  # before any forward pass
    model = _float_copy(model)  # the caller's model keeps its dtype and mode
    inputs, dev = _timm_inputs(model), next(model.parameters()).device
    correct = 0
    for i in tqdm(range(0, len(data), batch_size), desc="accuracy", leave=False, disable=not progress):
        x = inputs(data.images[i : i + batch_size]).to(dev)
        correct += int((model(x).argmax(-1).cpu() == data.labels[i : i + batch_size]).sum())
    return correct / len(data)


@torch.no_grad()
def distillation_facts(student: nn.Module, teacher: nn.Module, data: ImageArray, batch_size: int = 500,
                       progress: bool = True) -> dict:
    """What a DeiT-distilled ViT (timm ``VisionTransformerDistilled``: a class and a distillation token, each with
    its head) learned from its teacher, on ``data`` with each model's own timm eval transform: the test accuracy of
    the class head alone, the distillation head alone and the readout (the mean of their logits, what the model
    predicts), the teacher's own accuracy, how often the readout and the distillation head take the teacher's
    decision, and two numbers about the teacher's errors: the readout's accuracy on the images the teacher gets
    wrong, and the share of the readout's errors that are the teacher's very mistake (the same wrong class).
    ``progress``: a progress bar over the batches."""
    from tqdm.auto import tqdm

    check_count("batch_size", batch_size)
    student, teacher = _float_copy(student), _float_copy(teacher)  # the callers' models keep their dtype and mode
    student_inputs, teacher_inputs = _timm_inputs(student), _timm_inputs(teacher)
    sdev, tdev = next(student.parameters()).device, next(teacher.parameters()).device
    hits = dict.fromkeys(("class_head", "distillation_head", "readout", "teacher"), 0)
    agree = dict.fromkeys(("readout", "distillation_head"), 0)
    teacher_wrong = right_where_teacher_wrong = student_wrong = same_mistake = 0
    for i in tqdm(range(0, len(data), batch_size), desc="distillation", leave=False, disable=not progress):
        images, y = data.images[i : i + batch_size], data.labels[i : i + batch_size]
        feats = student.forward_features(student_inputs(images).to(sdev))  # (B, T, D): class token 0, distillation 1
        cls, dist = student.head(feats[:, 0]), student.head_dist(feats[:, 1])  # (B, K) each
        pred = {"class_head": cls.argmax(-1), "distillation_head": dist.argmax(-1),
                "readout": student.forward_head(feats).argmax(-1),
                "teacher": teacher(teacher_inputs(images).to(tdev)).argmax(-1)}
        pred = {k: v.cpu() for k, v in pred.items()}
        for k in hits:
            hits[k] += int((pred[k] == y).sum())
        for k in agree:
            agree[k] += int((pred[k] == pred["teacher"]).sum())
        t_wrong, s_wrong = pred["teacher"] != y, pred["readout"] != y
        teacher_wrong += int(t_wrong.sum())
        right_where_teacher_wrong += int((t_wrong & ~s_wrong).sum())
        student_wrong += int(s_wrong.sum())
        same_mistake += int((s_wrong & (pred["readout"] == pred["teacher"])).sum())
    n = len(data)
    return {**{k: v / n for k, v in hits.items()}, **{f"{k}_agrees_with_teacher": v / n for k, v in agree.items()},
            "readout_where_teacher_wrong": right_where_teacher_wrong / teacher_wrong if teacher_wrong else None,
            "readout_errors_shared_with_teacher": same_mistake / student_wrong if student_wrong else None,
            "images": n}


def export_run(run_dir: str | os.PathLike, out: str | os.PathLike, *, command: str,
               dtype: torch.dtype = torch.float16, hardware: str | None = None, goal: float | None = None,
               recipe: dict | None = None, test: ImageArray | None = None, progress: bool = True) -> dict:
    """Write ``out`` (checkpoint + ``MODEL_CARD.md``) from the last checkpoint of ``run_dir``; returns the card facts.

    ``recipe``: facts of a run shipped as a seed of a recipe (``export_recipe``), added to the card's facts and named
    on the card: ``recipe`` (its name), ``full_epochs`` (the recipe's full schedule; fewer epochs planned make the
    card say it is a shortened one) and ``emergence`` (``vitlab.train.emergence.snapshot_history``'s records);
    the card's JSON then holds the run's per-epoch ``history`` too.

    A run pre-trained by masked patch prediction (``objective="mpp"``) ships its prediction head too
    (``objective.safetensors``, same dtype, same atomic folder swap; ``vitlab.train.mpp.load_mpp`` reads both), and its card
    leads with what it learned: the masked-patch accuracy on every test image (one fixed corruption draw), measured
    from the shipped weights. Its classification head was never trained, so it reports no test accuracy.

    ``test``: the run's test split when the caller has loaded it (default: loaded here); ``progress``: progress bars
    while the test accuracy is measured."""
    if goal is not None and not 0 < goal <= 1:  # a fraction, as the accuracies are: 90 drew "goal 9000%"
        raise ValueError(f"goal must be a fraction in (0, 1], e.g. 0.9 for a 90% accuracy goal, got {goal:g}")
    run = Path(run_dir)
    ck = run / "checkpoint"
    if not (ck / "config.json").is_file():  # a misspelt, empty or never-trained run folder, or a file
        raise FileNotFoundError(f"{run} holds no training checkpoint ({ck / 'config.json'} is missing): pass the run "
                                "folder that vitlab train wrote (--run-dir of train, by default "
                                "$VITLAB_CACHE/runs/PRESET)")
    meta = json.loads((ck / "config.json").read_text())
    train_cfg = {**meta["train"], **{k: _portable(meta["train"][k]) for k in ("data", "init_from", "teacher")
                                     if k in meta["train"]}}  # as the card and the shipped config name them
    is_mpp = train_cfg.get("objective", "classify") == "mpp"
    modules = None
    if is_mpp:
        model, head = load_mpp(run)  # the encoder and its prediction head, both shipped
        modules = {"objective": head}
    else:
        model = load_checkpoint(ck)
    # the data set's whole test split; a qualified label (an MPP study's "shapes[n=256]") names the same data set
    if test is None:
        test = load_dataset(base_dataset(meta["train"]["data"]), "test")
    out = Path(out)
    check_replaceable(out)  # before the work: a folder that is not a checkpoint is never replaced
    staging = temp_dir_beside(out)  # a failure to make it names --out, not the temporary folder
    try:  # weights, head, card and curve are built beside ``out`` and swapped in together, or not at all
        with disk_full_named(out):  # a full disk names --out, never the staging folder, and stops the export
            tmp_out = save_checkpoint(model, staging / out.name, dtype=dtype, modules=modules, extra={
                "epoch": meta["epoch"], "train": train_cfg, "metrics": meta.get("metrics"), "data": meta.get("data"),
                "environment": meta.get("environment"), "train_seconds": meta.get("train_seconds")})
            facts = _measure_and_describe(run, meta, train_cfg, tmp_out, out, test, command, dtype, hardware, goal,
                                          is_mpp, modules, recipe, progress)
        replace_dir(tmp_out, out)
    finally:
        rmtree_quiet(staging)
    return facts


def _measure_and_describe(run: Path, meta: dict, train_cfg: dict, tmp_out: Path, out: Path, test: ImageArray,
                          command: str, dtype: torch.dtype, hardware: str | None, goal: float | None, is_mpp: bool,
                          modules: dict | None, recipe: dict | None = None, progress: bool = True) -> dict:
    """Measure the checkpoint written to ``tmp_out`` and write its card, card.json and learning curve there; the
    card names ``out``, where the folder will live (``recipe``: as ``export_run`` takes it)."""
    history = run_history(run, meta)
    tta = train_cfg.get("eval_tta") or 0
    acc = acc_tta = mpp_test = None
    distillation: dict = {}
    if is_mpp:
        from vitlab.train.loop import evaluate_mpp

        shipped, objective = load_mpp(tmp_out)  # the shipped encoder and head, read back
        mpp_test = evaluate_mpp(shipped, objective, test, n=len(test))
    else:
        shipped = load_checkpoint(tmp_out)
        if train_cfg.get("teacher") and hasattr(shipped, "head_dist"):  # its readout is the shipped accuracy
            distillation = _distillation(shipped, train_cfg["teacher"], meta["train"]["teacher"], test, progress)
        acc = (distillation["readout"] if "readout" in distillation
               else timm_pipeline_accuracy(shipped, test, progress=progress))
    if tta and not is_mpp:
        from vitlab.train.loop import evaluate

        acc_tta = evaluate(shipped.float(), test, tta=tta)
    precision = _precision(history, train_cfg)
    facts = {
        "command": command,
        "objective": train_cfg.get("objective", "classify"),
        "epochs_done": meta["epoch"],
        "epochs_planned": train_cfg["epochs"],
        "train_seconds": meta.get("train_seconds"),
        "hardware": hardware or _hardware(meta.get("environment") or {}, precision),
        "data": _data_record(meta),
        "test_accuracy": acc,
        "test_split": test.source,  # what the shipped model's numbers were measured on (all of it)
        "test_images": len(test),
        "test_accuracy_tta": acc_tta,
        "tta_level": tta if acc_tta is not None else 0,
        "train_hours": round(run_hours(history), 3),
        "warm_start_from": train_cfg.get("init_from"),  # portable already (export_run)
        "teacher": train_cfg.get("teacher"),
        "distill": train_cfg.get("distill") if train_cfg.get("teacher") else None,
        "test_accuracy_during_training": meta.get("metrics", {}).get("test_accuracy"),
        "training_precision": precision,
        "compiled_epochs": sum(1 for h in history if h.get("compiled")),  # epochs whose step ran through torch.compile
        "parameters": sum(p.numel() for p in shipped.parameters()),
        "file_bytes": sum((tmp_out / f).stat().st_size for f in ["model.safetensors",
                                                                 *(f"{n}.safetensors" for n in modules or {})]),
        "dtype": str(dtype).replace("torch.", ""),
        "versions": versions(),  # where it was exported and measured
        "train_versions": {k: (meta.get("environment") or {}).get(k) for k in ("torch", "timm")},  # where it trained
    }
    if distillation:
        facts["distillation"] = distillation
    run_id = (run / RUN_ID).read_text().strip() if (run / RUN_ID).is_file() else None
    if run_id:
        facts["run_id"] = run_id  # a later export of this run recognises this card as its own
    facts.update(_warm_start_facts(meta["train"].get("init_from"), facts["train_hours"], tmp_out / "model.safetensors",
                                   run_id))
    earlier = facts.pop("earlier_legs", [])
    facts["lineage"] = [*earlier, _leg(facts)]  # every leg of the model's training, this one last
    if is_mpp:
        facts.update(mpp_target=train_cfg.get("mpp_target"), mpp_rate=train_cfg.get("mpp_rate"), mpp_test=mpp_test,
                     mpp_test_images=len(test))
        facts["curve_images"], facts["curve_images_short"] = _mpp_curve_images(history, test)
    from vitlab.models.load import DEFAULT_CHECKPOINT

    facts["path"] = _portable(str(Path(out).absolute()))
    facts["is_default"] = out.resolve() == Path(DEFAULT_CHECKPOINT).resolve()
    # the outcome as the card records it: the folder by its name, never the staging folder's temporary path
    if recipe is not None:
        facts.update(_recipe_facts(recipe, facts, history))
    facts["learning_curve"] = _learning_curve(history, tmp_out / "learning_curve.png", facts, goal,
                                              out.name).replace(str(tmp_out), out.name)
    (tmp_out / CARD_NAME).write_text(card_text(facts, train_cfg, history, shipped), encoding="utf-8")
    (tmp_out / "card.json").write_text(json.dumps(facts, indent=2) + "\n", encoding="utf-8")
    return facts


def _data_record(meta: dict) -> dict | None:
    """The run's data record, with ``validation_images`` (the images held out of the training split for every
    choice) for a run that kept a validation split and trained before its checkpoint recorded the count."""
    data, per_class = meta.get("data"), int(meta["train"].get("val_per_class") or 0)
    if not data or not per_class or "validation_images" in data:
        return data
    return {**data, "validation_images": per_class * len(data.get("classes") or [])}


def _recipe_facts(recipe: dict, facts: dict, history: list[dict]) -> dict:
    """The facts a seed of a recipe adds to its card (``export_run``'s ``recipe``): its name, the full schedule and
    whether this run's is shortened, the emergence records and the per-epoch history."""
    full = recipe.get("full_epochs")
    return {"recipe": recipe.get("recipe"), "seed": recipe.get("seed"), "full_epochs": full,
            "shortened": bool(full is not None and facts["epochs_planned"] < full),
            "emergence": list(recipe.get("emergence") or []), "history": history}


def _distillation(shipped: nn.Module, teacher: str, trained_with: str, test: ImageArray,
                  progress: bool = True) -> dict:
    """``distillation_facts`` of the shipped student against the teacher it learned from, looked for where the card
    names it (``teacher``, relative to the checkout), then where the run found it (``trained_with``); or why they
    are missing."""
    for path in dict.fromkeys((teacher, trained_with)):
        try:
            t = load_teacher(path, torch.device("cpu"))
        except FileNotFoundError:
            continue
        return distillation_facts(shipped, t, test, progress=progress)
    return {"missing": f"its teacher `{teacher}` was not found at export"}


def _mpp_curve_images(history: list[dict], test: ImageArray) -> tuple[str, str]:
    """Which test images the in-training masked-patch evaluations saw (``vitlab.train.loop.evaluate_mpp``): a sentence
    for the card and a few words for the learning curve's legend."""
    evals = [h["mpp_test"] for h in history if h.get("mpp_test")]
    if not evals:
        return "nothing: the run was not evaluated during training", "no evaluations"
    spread = {bool(e.get("spread")) for e in evals}
    if spread == {True}:
        n = sorted({e["images"] for e in evals})
        return f"{', '.join(f'{k:,}' for k in n)} test images spread evenly over the split", f"{n[-1]:,} test images"
    n = min(1000, len(test))
    classes = sorted({test.classes[int(c)] for c in test.labels[:n]})
    first = f"the first {n:,} test images (the evaluation before it spread its images over the split)"
    if spread == {True, False}:
        return (f"{first} in its earlier epochs and images spread evenly over the split after (the run resumed across "
                "the change), so the curve's points are not comparable with each other", "mixed test images")
    if len(classes) == 1:
        return (f"{first}: all of class {classes[0]!r}, since the split is stored class by class, so the curve sits "
                "apart from the headline on all images", f"first {n:,} test images: all {classes[0]}")
    return first, f"first {n:,} test images"


def _learning_curve(history: list[dict], path: Path, facts: dict, goal: float | None, name: str) -> str:
    """Test accuracy (for an MPP run: masked-patch accuracy, or for its l2 target the masked-patch loss) against
    cumulative training hours, as a plotly PNG beside the card; returns the outcome."""
    from vitlab.figures.plots import learning_curve
    from vitlab.figures.static import write_images

    metric, value_of, final, percent = card_series(facts)
    mpp = facts.get("objective") == "mpp"
    t0 = facts.get("warm_start_hours") or 0.0  # a warm start's curve continues at the hours it started from
    hours, acc = training_curve(history, value_of, t0)
    where = " · ".join(x for x in (facts["data"]["train"] if facts.get("data") else "", facts.get("hardware", "")) if x)
    title = f"{name}: {metric} against training hours<br><sup>{where}</sup>"
    fig = learning_curve(hours, acc, title=title, final=final, goal=None if mpp else goal, metric=metric,
                         curve_label=f"during training ({facts['curve_images_short']}, {facts['training_precision']})"
                         if mpp else None,
                         final_label=f"as shipped ({facts['dtype']}, all {facts['mpp_test_images']:,} test images)"
                         if mpp else f"as shipped ({facts['dtype']}, timm transform)", percent=percent,
                         start=(t0, facts.get("warm_start_test_accuracy"), f"warm start ({facts['warm_start_from']})")
                         if facts.get("warm_start_hours") is not None and not mpp else None,
                         earlier=[(leg["total_train_hours"], leg["test_accuracy"]) for leg in facts["lineage"][:-1]
                                  if leg["test_accuracy"] is not None] if not mpp else None)
    return write_images([fig], [path], scale=2)


def _hardware(env: dict, precision: str) -> str:
    """Where the run trained, from its checkpoint's environment: the GPUs, or the CPU with the threads its processes
    used of its cores (e.g. "AMD EPYC, 1 of 2 cores, fp32"). Runs saved before the CPU and cores were recorded take
    them from this machine (only their thread count is the training's)."""
    world = int(env.get("world_size") or 1)
    if str(env.get("device", "cpu")).startswith("cuda"):
        gpu = env.get("gpu") or "CUDA GPU"
        return f"{world} x {gpu}, {precision}" if world > 1 else f"{gpu}, {precision}"
    cores = env.get("cores") or usable_cores()
    threads = env.get("threads") and env["threads"] * world
    used = f"{threads} of {cores} cores" if threads and cores and threads < cores else f"{cores} cores"
    return f"{env.get('cpu') or cpu_model()}, {used}, {precision}"


def _warm_start_facts(init_from: str | None, train_hours: float, shipped_weights: Path | None = None,
                      run_id: str | None = None) -> dict:
    """For a warm-started run, what its starting checkpoint had cost and reached, so that a model trained over
    several warm starts (one a session on a machine whose run state does not survive) states its whole training
    time: ``warm_start_hours`` (the checkpoint's own ``total_train_hours``, else its ``train_hours``, else its
    ``train_seconds``), ``warm_start_test_accuracy`` and ``total_train_hours``. Empty without a warm start or
    without a card to read (a bare weights folder: its cost is unknown, and the card then says only where it
    started). Exporting a run again onto the folder it started from (the default's case) finds its own earlier
    export there (the card's ``run_id`` is this run's, or the same bytes as ``shipped_weights``: an export during
    the run followed by more epochs differs in bytes) and keeps the start that card recorded."""
    if not init_from:
        return {}
    p = resolve_folder(init_from)
    card = p / "card.json"
    if not card.is_file():
        return {}
    c = json.loads(card.read_text())
    own = (run_id is not None and c.get("run_id") == run_id) or (
        shipped_weights is not None and (p / shipped_weights.name).is_file()
        and (p / shipped_weights.name).read_bytes() == shipped_weights.read_bytes())
    if own:
        if c.get("warm_start_hours") is None:  # this run's own card, with no start recorded: nothing to add
            return {}
        legs = c.get("lineage")  # the start's legs are this card's, less its own (the leg exported again)
        c = {"total_train_hours": c["warm_start_hours"], "test_accuracy": c.get("warm_start_test_accuracy"),
             **({"lineage": legs[:-1]} if legs else {})}
    hours = c.get("total_train_hours", c.get("train_hours"))
    if hours is None and c.get("train_seconds") is not None:
        hours = c["train_seconds"] / 3600
    if hours is None:
        return {}
    earlier = c.get("lineage") or _legs_before_lineages(c, round(hours, 3))
    return {"warm_start_hours": round(hours, 3), "warm_start_test_accuracy": c.get("test_accuracy"),
            "total_train_hours": round(hours + train_hours, 3), "earlier_legs": earlier}


def _legs_before_lineages(c: dict, hours: float) -> list[dict]:
    """The legs of a card written before lineages were kept: one, or two for a warm-started one (everything before
    its start as one leg of unknown epochs, machine and command, then its own leg)."""
    if c.get("warm_start_hours") is None:  # its training was one leg
        return [_leg({**c, "total_train_hours": hours, "train_hours": hours})]
    before = _leg({"total_train_hours": c["warm_start_hours"], "test_accuracy": c.get("warm_start_test_accuracy")})
    return [before, _leg({**c, "total_train_hours": hours})]


#: what a card's ``lineage`` keeps of each leg of training (one leg per warm start)
LEG_FIELDS = ("total_train_hours", "train_hours", "test_accuracy", "epochs_done", "hardware", "command")


def _leg(card: dict) -> dict:
    """One leg of a lineage from its card's facts: where it ended in cumulative hours (``total_train_hours``; the
    leg's own hours for a first leg), its own hours, the shipped model's test accuracy (None for an MPP encoder),
    epochs, machine and command; what a card did not record is None."""
    leg = {k: card.get(k) for k in LEG_FIELDS}
    if leg["total_train_hours"] is None:
        leg["total_train_hours"] = leg["train_hours"]
    return leg


def _portable(path: str | None) -> str | None:
    """A path as a card names it (``vitlab.data.datasets.portable_source``: relative to the checkout or the working
    directory, never this machine's absolute path); names and relative paths stay as they are."""
    return portable_source(path) if isinstance(path, str) and os.path.isabs(path) else path


def _precision(history: list[dict], train_cfg: dict) -> str:
    """The precision the epochs ran in: "bf16", "fp32", or both in epoch order ("bf16, then fp32") for a run resumed
    on a machine without fast bf16 (vitlab.base.precision); epochs recorded before the field existed ran as configured."""
    configured = "bf16" if train_cfg.get("bf16", True) else "fp32"
    seen: list[str] = []
    for h in history:
        p = h.get("precision", configured)
        if not seen or seen[-1] != p:
            seen.append(p)
    return ", then ".join(seen) or configured


def export_recipe(runs: Sequence[str | os.PathLike], out: str | os.PathLike, *, name: str | None = None,
                  full_epochs: int | None = None, command: str | None = None, hardware: str | None = None,
                  allow_unfinished: bool = False, progress: bool = False) -> list[dict]:
    """Ship the runs of one recipe (its seeds, trained by one preset) as ``out/seed<n>/``, n each run's training
    seed: ``export_run`` of each, with the Fig. 7 statistics of every snapshot (``snapshot_history``) and the
    per-epoch history in its card's JSON, and the test accuracy measured once, on export. Returns the cards' facts
    in seed order.

    ``name``: the recipe (default: ``out``'s folder name, e.g. ``vit_cifar10_noteacher``); ``command``: the
    training command on each card, ``{seed}`` standing for the seed (default ``vitlab train --preset NAME --set
    seed={seed}``); ``full_epochs``: the recipe's full schedule (a card of a run planned for fewer says it is a
    shortened one). Raises ``ValueError`` for no runs, runs whose training configurations differ other than in the
    seed (naming the keys), two runs of one seed, or an unfinished run (unless ``allow_unfinished``);
    ``FileNotFoundError`` for a run without a checkpoint or snapshots; ``DataError`` (``load_dataset``) when the
    test split cannot be read, and ``FolderError`` for an ``out/seed<n>`` that holds something else; all before any
    snapshot is measured."""
    from vitlab.train.emergence import snapshot_history

    if not runs:
        raise ValueError("export_recipe needs at least one run folder (RUN/checkpoint written by vitlab train)")
    if full_epochs is not None and full_epochs < 1:
        raise ValueError(f"full_epochs must be a whole number of at least 1, got {full_epochs}")
    out = Path(out)
    name = name or out.name
    metas = [_recipe_run_meta(Path(r), allow_unfinished) for r in runs]
    first = {k: v for k, v in metas[0]["train"].items() if k != "seed"}
    for run, meta in zip(runs[1:], metas[1:]):
        differ = sorted(k for k in set(first) | set(meta["train"]) - {"seed"}
                        if first.get(k) != meta["train"].get(k))
        if differ:
            raise ValueError(f"{run} is not a seed of the recipe of {runs[0]}: its training configuration differs in "
                             f"{', '.join(differ)}; a recipe's runs differ in their seed only")
    seeds = [int(m["train"]["seed"]) for m in metas]
    if len(set(seeds)) < len(seeds):
        raise ValueError(f"two runs have the same seed ({seeds}): a recipe's runs are distinct seeds")
    template = command or f"vitlab train --preset {name} --set seed={{seed}}"
    for seed in seeds:
        check_replaceable(out / f"seed{seed}")
    # one recipe, one data set (checked above): missing data stops here, not after minutes of snapshot statistics
    test = load_dataset(base_dataset(metas[0]["train"]["data"]), "test")
    facts = []
    for run, seed in sorted(zip(runs, seeds), key=lambda rs: rs[1]):
        records = snapshot_history(run, progress=progress)
        facts.append(export_run(run, out / f"seed{seed}", command=template.format(seed=seed), hardware=hardware,
                                recipe={"recipe": name, "seed": seed, "full_epochs": full_epochs,
                                        "emergence": records}, test=test, progress=progress))
    return facts


def _recipe_run_meta(run: Path, allow_unfinished: bool) -> dict:
    """The checkpoint record of a run of a recipe, checked to be exportable as one (``export_recipe``)."""
    ck = run / "checkpoint" / "config.json"
    if not ck.is_file():
        raise FileNotFoundError(f"{run} holds no training checkpoint ({ck} is missing): pass the run folders that "
                                "vitlab train wrote")
    if not (run / "snapshots").is_dir():
        raise FileNotFoundError(f"{run} has no snapshots (RUN/snapshots/epoch_NNNN): train it with snapshot_every=1 "
                                "(the recipe presets do)")
    meta = json.loads(ck.read_text())
    if meta["epoch"] < meta["train"]["epochs"] and not allow_unfinished:
        raise ValueError(f"{run} is not finished: {meta['epoch']} of {meta['train']['epochs']} epochs; resume it "
                         "(vitlab train --resume) or ship it as it is with allow_unfinished (--allow-unfinished)")
    return meta
