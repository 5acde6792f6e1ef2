"""The masked-patch-prediction study (paper section 4.6) in miniature: one resumable command, one JSONL record per row.

The paper pre-trains ViT-B/16 by masked patch prediction (MPP) and reaches 79.9% on ImageNet after fine-tuning: 2
points above training from scratch, 4 below supervised pre-training (scratch < MPP < supervised); a 15% corruption
rate and the two other targets did slightly worse than 50% and the 3-bit mean colour. The analogue here:

* **pre-training** through ``vitlab.train.loop.train`` with ``objective="mpp"`` on the training images, labels unread:
  the main run (``main``: 3-bit mean colour, 50% corrupted, ``main_epochs``) and the ablation runs (``ablations``,
  all on the same shorter budget ``ablation_epochs``, optionally on fewer images ``ablation_examples``, the main
  target and rate among them). Each run lives in a folder named by a hash of its ``TrainConfig`` under
  ``run_root`` (outside the work tree): a killed study resumes
  a pre-training run at its last epoch, and a run whose config did not change is reused (also after a code change:
  each record stores the code hash of the checkpoint it used; delete the folder to pre-train again).
* **three initialisations of one shape**: ``scratch`` (random weights: for the few-shot row the very init the MPP
  run started from, same config and seed; for a fine-tune the fine-tune seed's init), ``mpp`` (the main run's
  encoder; its classification head was never trained, so a fine-tune starts it from the fine-tune seed's init, the
  same head scratch starts with) and ``supervised`` (a vitlab checkpoint, by default the shipped
  ``data/checkpoints/vit_cifar10``, whose weights' sha256 every record holds; used as it is: a DeiT distillation
  token stays, its features are its own readout, ``forward_head(pre_logits=True)``, and a fine-tune starts from
  its trained heads, which already know these classes: part of what supervised pre-training on the same labels
  gives).
* **(a) few-shot**: the paper's ridge probe (``vitlab.probe.linear.few_shot_accuracy``) on frozen features, the shots drawn
  from a class-balanced pool of training images with each probe seed (the same shots for every initialisation),
  scored on the test images, for two readouts of the same features: the model's own and the mean of the patch
  tokens (``vitlab.probe.features.READOUTS``; MPP trains only the patch outputs, so its class token stays untrained and
  the model readout alone would judge MPP on a token it never learned); the ablation runs get this row only.
  **(b) fine-tune**: ``train`` with ``init_from`` (scratch: none) on a class-balanced labelled subset per seed (the seed fixes the subset, data order and
  augmentation, shared by the three initialisations), scored on the test images at the end.

Every row's record carries its ``spec`` (everything its number depends on: data, shapes, the pre-training or
fine-tune ``TrainConfig``, the supervised checkpoint's weights digest, the probe settings) and a fingerprint of
that spec and the package's code hash (``vitlab.base.provenance.fingerprint``). Running again skips every row whose latest
record has its current fingerprint and says how many and why; a failed row is recorded with its error and the
others go on. ``markdown_tables`` renders the comparison and the ablation from the records; the findings are judged from them
by ``vitlab.findings.studies.mpp_verdicts``.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import json
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tqdm.auto import tqdm

from vitlab.base.checks import check_count, check_int, check_plain_name, plain_int, whole_index
from vitlab.base.devices import resolve_device
from vitlab.base.provenance import fingerprint, json_digest, provenance
from vitlab.base.records import of_newest_code
from vitlab.base.shipped import CHECKOUT_DATA
from vitlab.base.stats import percent_cell
from vitlab.data.datasets import ImageArray, cache_dir, load_splits, nested_subsets
from vitlab.models.config import ViTConfig, cifar_vit, config_to_dict
from vitlab.models.zoo import build_model
from vitlab.probe.features import READOUTS
from vitlab.probe.linear import DEFAULT_L2
from vitlab.train.config import (
    PRESETS,
    TrainConfig,
    train_config_from_dict,
    train_config_to_dict,
    with_model_classes,
    with_num_classes,
)
from vitlab.train.history import read_history
from vitlab.train.mpp import MPP_TARGETS

__all__ = ["MPPStudyConfig", "STUDIES", "StudyRow", "study_rows", "row_spec", "pretrain_config",
           "pretrain_run_config", "finetune_config", "pretrain_dir", "run_study", "latest_records", "shown_records",
           "markdown_tables", "few_shot_key", "default_results", "row_status", "scratch_model", "supervised_model",
           "INITS"]

#: The three initialisations of the comparison, in table order.
INITS = ("scratch", "mpp", "supervised")


@dataclass(frozen=True)
class StudyRow:
    """One result row: ``kind`` "few_shot" or "finetune"; ``init`` one of ``INITS`` or "ablation:TARGET@RATE";
    ``seed`` the fine-tune seed (few-shot rows hold all probe seeds)."""

    kind: str
    init: str
    seed: int | None = None

    @property
    def row_id(self) -> str:
        return f"{self.kind}/{self.init}" + ("" if self.seed is None else f"/s{self.seed}")


def _rate_text(rate: float) -> str:
    """A corruption rate as row ids name it, read back exactly by ``pretrain_run_config``: ``:g`` (0.5, 0.15, the
    shipped store's ids) where that round-trips, else ``repr`` (0.1234567, never rounded to 0.123457)."""
    text = f"{rate:g}"
    return text if float(text) == rate else repr(float(rate))


def _ablation(target: str, rate: float) -> str:
    return f"ablation:{target}@{_rate_text(rate)}"


def study_rows(study: MPPStudyConfig) -> list[StudyRow]:
    """In running order: the comparison first (few-shot, then fine-tunes seed by seed), the ablation last, so a
    study stopped early has whole comparisons."""
    rows = [StudyRow("few_shot", i) for i in INITS]
    rows += [StudyRow("finetune", i, s) for s in study.seeds for i in INITS]
    rows += [StudyRow("few_shot", _ablation(t, r)) for t, r in study.ablations]
    return rows


@dataclass(frozen=True)
class MPPStudyConfig:
    """Everything the study runs; ``STUDIES`` holds the named ones."""

    name: str
    data: str = "cifar10"
    #: the shape of all three initialisations (a plain ViT: MPP needs every patch token and no distillation token)
    model: ViTConfig = field(default_factory=cifar_vit)
    #: the supervised initialisation: a vitlab checkpoint of the same shape (relative: to the cwd, then the repo)
    supervised: str = "data/checkpoints/vit_cifar10"
    #: pre-training run folders; None: $VITLAB_CACHE/runs/mpp_study (~/.cache/vitlab/runs/mpp_study)
    run_root: str | None = None
    seed: int = 0  # pre-training seed, and the seed of the scratch initialisation (the MPP run's own init)
    # pre-training (vitlab.train.config PRESETS["mpp_cifar10"] with these changes)
    main: tuple[str, float] = ("color3", 0.5)  # (target, corruption rate) of the run the comparison uses
    main_epochs: int = 6
    ablations: tuple[tuple[str, float], ...] = (("color3", 0.5), ("color3", 0.15), ("patch4x4", 0.5), ("l2", 0.5))
    ablation_epochs: int = 1
    pretrain_examples: int | None = None  # class-balanced cap on the pre-training images (None: all)
    #: the same cap for the ablation runs only (None: pretrain_examples): a cheaper budget for the four runs compared
    #: only with each other (nested: their images are among the main run's)
    ablation_examples: int | None = None
    pretrain_batch_size: int = 256
    pretrain_lr: float = 1e-3
    # (a) few-shot probe on frozen features
    shots: tuple[int, ...] = (1, 5, 10, 25)
    probe_seeds: tuple[int, ...] = (0, 1, 2)
    probe_pool_per_class: int = 500  # training images per class the shots are drawn from
    test_per_class: int | None = None  # test images per class for both scores (None: the whole test set)
    l2: float = DEFAULT_L2
    verdict_shots: int = 10  # the shot count the few-shot verdicts compare
    # (b) fine-tune on a labelled subset
    finetune_per_class: int = 500
    finetune_epochs: int = 3
    finetune_batch_size: int = 128
    finetune_lr: float = 5e-4
    seeds: tuple[int, ...] = (0, 1, 2)  # fine-tune seeds (subset, order, augmentation)
    bf16: bool = True

    def __post_init__(self) -> None:
        """Every field checked when the study is made (a bad value would otherwise fail row after row, and the name
        becomes the results file's); ValueError naming the field."""
        check_plain_name("name", self.name)  # it names the results file mpp_NAME.jsonl
        for target, rate in (self.main, *self.ablations):
            if target not in MPP_TARGETS or not 0 < rate <= 1:
                raise ValueError(f"MPP runs need a target in {MPP_TARGETS} and a rate in (0, 1], got {(target, rate)}")
        for name in ("main_epochs", "ablation_epochs", "finetune_epochs", "finetune_per_class"):
            check_count(name, getattr(self, name))  # True is no 1 epoch, 2.5 no count
        for name in ("pretrain_examples", "ablation_examples"):
            check_int(name, getattr(self, name), 1, allowed="a positive number of images or None (all)", none=True,
                      numpy=True)
        if None not in (self.pretrain_examples, self.ablation_examples) and \
                self.ablation_examples > self.pretrain_examples:
            raise ValueError(f"ablation_examples={self.ablation_examples} exceeds pretrain_examples="
                             f"{self.pretrain_examples}: the ablation runs draw from the main run's images")
        if (not self.shots or not all(whole_index(k) and k >= 1 for k in self.shots)
                or max(self.shots) > self.probe_pool_per_class):
            raise ValueError(f"shots {list(self.shots)} must be whole numbers of at least 1 and at most "
                             f"probe_pool_per_class={self.probe_pool_per_class}")
        if not whole_index(self.verdict_shots) or self.verdict_shots not in self.shots:  # True would pass for 1
            raise ValueError(f"verdict_shots={self.verdict_shots} is not among the shots {list(self.shots)}: add it")
        if not self.seeds or not self.probe_seeds:
            raise ValueError("seeds and probe_seeds need at least one seed each (2 or more for an interval)")
        for name in ("seeds", "probe_seeds"):  # True is no seed 1, 0.5 no seed; a NumPy int no JSON record
            got = list(getattr(self, name))
            if not all(plain_int(s) for s in got):
                raise ValueError(f"{name} {got} must be whole numbers (Python ints: no bool, float or NumPy integer)")
        if len(set(self.probe_seeds)) != len(self.probe_seeds):  # the fine-tune seeds: refused below, by row id
            raise ValueError(f"probe_seeds names a seed twice ({list(self.probe_seeds)}): each once, or its draw "
                             "counts twice and the spread looks smaller than it is")
        for target, rate in {self.main, *self.ablations}:  # a plain ViT (and a patch each target fits), or the error
            TrainConfig(model=self.model, objective="mpp", mixup_prob=0.0, label_smoothing=0.0, mpp_target=target,
                        mpp_rate=rate)
        ids = [row.row_id for row in study_rows(self)]
        if len(set(ids)) < len(ids):  # two rows under one id: the second would pass for the first in the store
            raise ValueError(f"rows {sorted({i for i in ids if ids.count(i) > 1})} would share one id, and one record: "
                             f"give each ablation (target, rate) and each fine-tune seed once (ablations "
                             f"{list(self.ablations)}, seeds {list(self.seeds)})")

    def root(self) -> Path:
        return Path(self.run_root).expanduser() if self.run_root else cache_dir() / "runs" / "mpp_study"


def _shapes_vit() -> ViTConfig:
    return PRESETS["vit_shapes"].model  # the shape of the shipped shapes ViT (data/checkpoints/vit_shapes)


STUDIES: dict[str, MPPStudyConfig] = {
    # The default ViT shape (ViT-Lite-7/4) on CIFAR-10. On a 2-core CPU with fast bf16 (AVX512-BF16, measured
    # 2026-11-25 with both cores idle: 330 training images/s for the colour target with all tokens, 204 for
    # patch4x4's 8,192-way head, 351 for a supervised step): main run 6 epochs (300k images, ~15 min); 4 ablation
    # runs of 1 epoch (200k images, ~12 min); 9 fine-tunes of 3 epochs on 5,000 images (135k images, ~7 min, plus
    # scoring 10,000 test images each); features of 5,000 pool and 10,000 test images for 7 models: about 45 min in
    # all. (On the 2-core CPU of 2026-11-23, whose main run trained at 134 images/s, it took 1 h 33 min.)
    # Its supervised initialisation is the shipped default: the records hold its weights' sha256 and a test checks
    # that the folder still holds them; replacing the default means freezing the old one as its own folder for
    # this study (or rerunning the study), never a silent swap.
    "cifar10": MPPStudyConfig("cifar10"),
    # Seconds: the shapes ViT's shape (4 blocks x 128, 8 px patches) on the synthetic shapes; the shipped shapes ViT
    # is the supervised initialisation.
    "smoke": MPPStudyConfig("smoke", data="shapes", model=_shapes_vit(),
                            supervised="data/checkpoints/vit_shapes", main_epochs=2, ablation_epochs=1,
                            pretrain_examples=256, ablation_examples=128, pretrain_batch_size=32, shots=(1, 5),
                            probe_seeds=(0, 1), probe_pool_per_class=10, test_per_class=50, verdict_shots=5,
                            finetune_per_class=16, finetune_epochs=2, finetune_batch_size=16, finetune_lr=1e-3,
                            seeds=(0, 1), bf16=False),
}


def default_results(study: MPPStudyConfig) -> Path:
    """The checkout's ``data/results/mpp_cifar10.jsonl`` (the shipped records) for the CIFAR-10 study, whatever the
    working directory, ``$VITLAB_CACHE/results/mpp_NAME.jsonl`` for the others."""
    return CHECKOUT_DATA / "results" / "mpp_cifar10.jsonl" if study.name == "cifar10" \
        else cache_dir() / "results" / f"mpp_{study.name}.jsonl"


# ---------------------------------------------------------------------------------------------- rows and specs


def pretrain_config(study: MPPStudyConfig, target: str, rate: float, epochs: int, examples: int | None):
    """The MPP preset (``PRESETS["mpp_cifar10"]``) on the study's shape, data, target, rate and budget (``examples``
    pre-training images, None: all); warmup: the preset's 2 epochs or a fifth of the run, whichever is shorter."""
    base = PRESETS["mpp_cifar10"]
    data = study.data if examples is None else f"{study.data}[n={examples}]"
    return dataclasses.replace(base, model=study.model, data=data, epochs=epochs, batch_size=study.pretrain_batch_size,
                               lr=study.pretrain_lr, warmup_epochs=min(base.warmup_epochs, epochs / 5),
                               mpp_target=target, mpp_rate=rate, seed=study.seed, bf16=study.bf16)


def _changed_fields(cfg) -> dict[str, Any]:
    """The fields of a ``TrainConfig`` (and of its model config) that differ from their defaults: a field added to
    ``TrainConfig`` later, with a default that keeps the old behaviour, leaves this unchanged."""
    d, ref = train_config_to_dict(cfg), train_config_to_dict(TrainConfig(model=type(cfg.model)()))
    out = {k: v for k, v in d.items() if k != "model" and v != ref.get(k)}
    out["model"] = {k: v for k, v in d["model"].items() if v != ref["model"].get(k)}
    return out


def pretrain_dir(study: MPPStudyConfig, cfg) -> Path:
    """The run folder of pre-training config ``cfg``: named by its target, rate, epochs and a hash of the config's
    non-default fields (so a new ``TrainConfig`` field with a neutral default does not orphan an hour of
    pre-training; ``train`` itself checks on resume that the saved config equals ``cfg``)."""
    key = json_digest(_changed_fields(cfg), 10)
    return study.root() / f"mpp-{cfg.mpp_target}-r{cfg.mpp_rate:g}-e{cfg.epochs}-{key}"


def pretrain_run_config(study: MPPStudyConfig, init: str):
    """The pre-training config behind an initialisation: ``"mpp"`` (the main run) or ``"ablation:TARGET@RATE"``;
    None for scratch and supervised. ``pretrain_dir(study, pretrain_run_config(study, "mpp"))`` is the main run."""
    if init == "mpp":
        return pretrain_config(study, *study.main, study.main_epochs, study.pretrain_examples)
    if init.startswith("ablation:"):
        target, rate = init.removeprefix("ablation:").split("@")
        return pretrain_config(study, target, float(rate), study.ablation_epochs, _examples_for(study, init))
    return None


def _examples_for(study: MPPStudyConfig, init: str) -> int | None:
    """The cap on the pre-training images of an MPP initialisation's run (None: all); an ablation run without a cap
    of its own has the main run's."""
    if init == "mpp" or study.ablation_examples is None:
        return study.pretrain_examples
    return study.ablation_examples


def _supervised_checkpoint(study: MPPStudyConfig) -> tuple[Path, ViTConfig, str]:
    """(folder, model config, sha256 of its weights) of the supervised initialisation, checked against the shape."""
    from vitlab.models.checkpoint import CONFIG_NAME, WEIGHTS_NAME, resolve_folder
    from vitlab.models.config import config_from_dict

    p = resolve_folder(study.supervised)
    if not (p / WEIGHTS_NAME).is_file() or not (p / CONFIG_NAME).is_file():
        raise FileNotFoundError(f"the supervised checkpoint {study.supervised} is not here ({p} has no {WEIGHTS_NAME}):"
                                " train and export it (vitlab train --preset vit_cifar10, then vitlab export) or point "
                                "the study's supervised= at a checkpoint of the same shape")
    cfg = config_from_dict(json.loads((p / CONFIG_NAME).read_text())["config"])
    keys = ("embed_dim", "depth", "num_heads", "mlp_dim", "patch_size", "img_size")
    if not isinstance(cfg, ViTConfig) or any(getattr(cfg, k) != getattr(study.model, k) for k in keys):
        got = {k: getattr(cfg, k, None) for k in keys}
        want = {k: getattr(study.model, k) for k in keys}
        raise ValueError(f"the supervised checkpoint {p} is not the study's shape: {got} against {want}; compare "
                         "like with like: pass a checkpoint of the study's shape or change the study's model")
    digest = hashlib.sha256((p / WEIGHTS_NAME).read_bytes()).hexdigest()
    return p, cfg, digest


def finetune_config(study: MPPStudyConfig, model: ViTConfig, seed: int, init_from: str | None):
    """One recipe for every initialisation: AdamW, warmup and cosine, crop and flip, label smoothing 0.1, no
    mixup, no patch dropping; evaluated on the test images once, at the end."""
    if model.patch_drop_rate:
        model = dataclasses.replace(model, patch_drop_rate=0.0)  # every initialisation sees every token
    e = study.finetune_epochs
    return TrainConfig(model=model, data=f"{study.data}[{study.finetune_per_class} per class, seed {seed}]", epochs=e,
                       batch_size=study.finetune_batch_size, lr=study.finetune_lr, warmup_epochs=min(1.0, e / 5),
                       weight_decay=0.05, label_smoothing=0.1, mixup_prob=0.0, seed=seed, eval_every=e,
                       init_from=init_from, bf16=study.bf16)


def _init_spec(study: MPPStudyConfig, init: str, supervised: tuple[Path, ViTConfig, str] | None) -> dict[str, Any]:
    if init == "scratch":
        return {"init": "scratch", "model": config_to_dict(study.model), "seed": study.seed}
    if init == "supervised":
        path, cfg, digest = supervised
        return {"init": "supervised", "checkpoint": study.supervised, "model": config_to_dict(cfg),
                "weights_sha256": digest}
    return {"init": init, "pretrain": train_config_to_dict(pretrain_run_config(study, init)),
            "pretrain_examples": _examples_for(study, init)}


def _finetune_model(study: MPPStudyConfig, init: str, supervised: tuple[Path, ViTConfig, str] | None) -> ViTConfig:
    return supervised[1] if init == "supervised" else study.model


def row_spec(study: MPPStudyConfig, row: StudyRow, supervised: tuple[Path, ViTConfig, str] | None) -> dict[str, Any]:
    """Everything the row's number depends on (the run folders' locations excluded)."""
    spec: dict[str, Any] = {"kind": row.kind, "data": study.data, "test_per_class": study.test_per_class,
                            "init": _init_spec(study, row.init, supervised)}
    if row.kind == "few_shot":
        spec.update(shots=list(study.shots), probe_seeds=list(study.probe_seeds),
                    probe_pool_per_class=study.probe_pool_per_class, l2=study.l2)
    else:
        cfg = finetune_config(study, _finetune_model(study, row.init, supervised), row.seed, None)
        spec.update(finetune=train_config_to_dict(cfg), per_class=study.finetune_per_class)
    return spec


# ---------------------------------------------------------------------------------------------- the work


@dataclass(frozen=True)
class _Data:
    train: ImageArray  # every training image: fine-tune subsets are drawn from it
    pretrain: dict[int | None, ImageArray]  # by the cap on their number (None: all)
    pool: ImageArray  # the few-shot pool
    test: ImageArray


def _balanced(data: ImageArray, per_class: int | None, seed: int) -> ImageArray:
    if per_class is None:
        return data
    return data.subset(nested_subsets(data.labels, [per_class * len(data.classes)], seed=seed)[0])


def _load_data(study: MPPStudyConfig, progress: bool = True) -> _Data:
    train, test = load_splits(study.data, progress)
    caps = sorted({study.pretrain_examples, study.ablation_examples} - {None})
    pretrain: dict[int | None, ImageArray] = {None: train}  # nested: a smaller cap's images are among a larger's
    pretrain.update(zip(caps, map(train.subset, nested_subsets(train.labels, caps, seed=study.seed))))
    return _Data(train, pretrain, _balanced(train, study.probe_pool_per_class, 0), _balanced(test, study.test_per_class, 0))


def _checkpoint_meta(run: Path) -> dict[str, Any] | None:
    f = run / "checkpoint" / "config.json"
    return json.loads(f.read_text()) if f.is_file() else None


def _pretrain(study: MPPStudyConfig, cfg, images: ImageArray, test: ImageArray, progress: bool,
              device: str | None) -> Path:
    """Pre-train ``cfg`` into its run folder, resuming it where it stopped; a finished run is not touched, but it must
    have been trained with ``cfg`` (else a changed default would pass an old encoder off as the new config's)."""
    from vitlab.train.loop import train

    run = pretrain_dir(study, cfg)
    meta = _checkpoint_meta(run)
    saved_file = run / "train_config.json"
    if saved_file.is_file():
        saved = train_config_from_dict(json.loads(saved_file.read_text()))
        if saved != with_num_classes(cfg, len(images.classes)):
            raise ValueError(f"the pre-training folder {run} holds a run of another config (a changed default or "
                             f"field?): delete that folder to pre-train again. saved={saved} requested={cfg}")
    if meta is None or meta["epoch"] < cfg.epochs:
        train(cfg, run, resume=meta is not None, progress=progress, train_data=images, test_data=test, device=device)
    return run


def _pretrain_facts(run: Path) -> dict[str, Any]:
    meta = _checkpoint_meta(run)
    # the folder's name under the study's root (pretrain_dir), never a machine's absolute path
    return {"run": run.name, "epochs": meta["epoch"], "train_seconds": meta.get("train_seconds"),
            "images": meta.get("data", {}).get("train_examples"), "mpp_test": meta.get("metrics", {}).get("mpp_test"),
            "code_hash": meta.get("environment", {}).get("code_hash")}


def _few_shot(model: torch.nn.Module, study: MPPStudyConfig, data: _Data, device: torch.device) -> dict[str, Any]:
    from vitlab.probe.features import extract_readouts
    from vitlab.probe.linear import few_shot_accuracy

    model = model.to(device).eval()
    out: dict[str, Any] = {}
    pool = extract_readouts(model, data.pool, READOUTS, cache=False, progress=False)  # one forward, both readouts
    test = extract_readouts(model, data.test, READOUTS, cache=False, progress=False)
    for readout in READOUTS:  # the model's own readout, and the patch tokens' mean (what MPP trains)
        ftr, fte = pool[readout], test[readout]
        fs = few_shot_accuracy(ftr, data.pool.labels, fte, data.test.labels, shots=study.shots,
                               seeds=study.probe_seeds, l2=study.l2)
        out[few_shot_key(readout)] = {str(k): {"mean": r.mean, "std": r.std, "per_seed": list(r.per_seed)}
                                      for k, r in fs.items()}
    return {**out, "feature_dim": int(ftr.shape[1]), "pool": len(data.pool), "test": len(data.test)}


def _finetune(study: MPPStudyConfig, model_cfg: ViTConfig, seed: int, init_from: str | None, data: _Data,
              device: str | None) -> dict[str, Any]:
    from vitlab.train.loop import train

    subset = _balanced(data.train, study.finetune_per_class, seed)
    cfg = finetune_config(study, model_cfg, seed, init_from)
    study.root().mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=study.root(), prefix="finetune.") as tmp:
        train(cfg, Path(tmp) / "run", progress=False, train_data=subset, test_data=data.test, device=device)
        log = read_history(Path(tmp) / "run")
    return {"test_accuracy": log[-1]["test_accuracy"], "train_examples": len(subset), "epochs": cfg.epochs,
            "final_train_loss": log[-1]["train_loss"], "train_seconds": round(sum(x["epoch_seconds"] for x in log), 2)}


def latest_records(records: Sequence[dict], study: str) -> dict[str, dict]:
    """{row_id: latest record} of one study (any fingerprint)."""
    return {r["row_id"]: r for r in records if r.get("study") == study}


def shown_records(records: Sequence[dict], study: str) -> tuple[list[dict], str]:
    """The rows to show together, and a note on what they are: the latest record of each row of ``study`` among the
    records of one code version, the newest one's (``vitlab.base.records.of_newest_code``), so that a partial rerun after a code
    change never pairs an old row with a new one. The note names that code version, the code of the pre-training
    runs the rows used (reused across code changes), and how many rows of other code versions were left out."""
    mine = [r for r in records if r.get("study") == study]
    if not mine:
        return [], f"no records of study {study!r}"
    newer, newest = of_newest_code(mine)
    kept = {r["row_id"]: r for r in newer}
    hidden = {r["row_id"] for r in mine} - set(kept)
    pre = sorted({str(r["metrics"]["pretrain"].get("code_hash")) for r in kept.values()
                  if r.get("status") == "ok" and "pretrain" in (r.get("metrics") or {})})
    note = f"rows of code version {newest}"
    if pre and pre != [newest]:
        note += f" (pre-training runs from code version {', '.join(pre)}, reused)"
    if hidden:
        note += f"; {len(hidden)} row(s) only recorded by other code versions left out: rerun `vitlab mpp-study`"
    return list(kept.values()), note


def _plan(study: MPPStudyConfig) -> tuple[list[tuple[StudyRow, dict[str, Any], str]], tuple[Path, ViTConfig, str]]:
    """Every row with its spec and fingerprint, and the supervised checkpoint (checked)."""
    supervised = _supervised_checkpoint(study)
    return [(row, spec, fingerprint({"spec": spec})) for row in study_rows(study)
            for spec in [row_spec(study, row, supervised)]], supervised


def row_status(study: MPPStudyConfig, records: Sequence[dict]) -> dict[str, str]:
    """{row_id: status} of every row of ``study`` given the store's ``records``: "done" (the latest record has the
    row's current fingerprint and finished), "failed" (current fingerprint, failed), "changed" (the latest record
    is from another config or code version) or "missing"."""
    return _statuses(study, _plan(study)[0], records)


def _statuses(study: MPPStudyConfig, plan: list[tuple[StudyRow, dict[str, Any], str]], records: Sequence[dict]
              ) -> dict[str, str]:
    latest = latest_records(records, study.name)
    out = {}
    for row, _, fp in plan:
        r = latest.get(row.row_id)
        out[row.row_id] = ("missing" if r is None else "changed" if r.get("fingerprint") != fp else
                           "done" if r.get("status") == "ok" else "failed")
    return out


def run_study(study: MPPStudyConfig, results: str | os.PathLike, progress: bool | None = None,
              device: str | None = None) -> list[dict]:
    """Run every row of ``study`` that is not done in ``results`` (``row_status``), pre-training what those rows
    need first; append one record per row. Returns the new records."""
    from vitlab.studies.scaling import ResultsStore

    store = ResultsStore(results)
    plan, supervised = _plan(study)
    status = _statuses(study, plan, store.records())
    todo = [(row, spec, fp) for row, spec, fp in plan if status[row.row_id] != "done"]
    if progress is not False:
        counts = {k: sum(1 for row, _, _ in todo if status[row.row_id] == k) for k in ("changed", "failed")}
        why = [f"{counts['changed']} because their config or the code changed since their record"] \
            if counts["changed"] else []
        why += [f"{counts['failed']} to retry after a failure"] if counts["failed"] else []
        print(f"mpp-study {study.name}: {len(plan) - len(todo)} of {len(plan)} rows already done with this config "
              f"and code, skipped; {len(todo)} to run" + (f" ({'; '.join(why)})" if why else ""), file=sys.stderr)
    if not todo:
        return []
    store.check_writable()
    pretrain = {}  # init -> TrainConfig, in first-needed order
    for row, _, _ in todo:
        cfg = pretrain_run_config(study, row.init)
        if cfg is not None:
            pretrain.setdefault(row.init, cfg)
    unfinished = {pretrain_dir(study, c) for c in pretrain.values()
                  if (_checkpoint_meta(pretrain_dir(study, c)) or {}).get("epoch", 0) < c.epochs}
    dev = resolve_device(device)
    data = _load_data(study, progress is not False)
    bar = tqdm(total=len(todo) + len(unfinished), desc=f"mpp-study {study.name}", disable=progress is False)
    runs: dict[str, Path | BaseException] = {}
    new: list[dict] = []
    try:
        for row, spec, fp in todo:
            started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            rec: dict[str, Any] = {"study": study.name, "row_id": row.row_id, "kind": row.kind, "init": row.init,
                                   "seed": row.seed, "spec": spec, "fingerprint": fp, "started": started}
            t0 = time.time()
            try:
                cfg = pretrain.get(row.init)
                run = None
                if cfg is not None:
                    key = pretrain_dir(study, cfg)
                    if str(key) not in runs:
                        try:
                            images = data.pretrain[_examples_for(study, row.init)]
                            runs[str(key)] = _pretrain(study, cfg, images, data.test, progress is not False, device)
                        except Exception as e:  # every row that needs this run fails with its error
                            runs[str(key)] = e
                        if key in unfinished:
                            bar.update()
                            bar.set_postfix_str(f"pre-trained {key.name}")
                    run = runs[str(key)]
                    if isinstance(run, BaseException):
                        raise RuntimeError(f"pre-training {key.name} failed: {type(run).__name__}: {run}") from run
                metrics = _row_metrics(study, row, run, supervised, data, dev, device)
                if run is not None:
                    metrics["pretrain"] = _pretrain_facts(run)
                metrics["seconds"] = round(time.time() - t0, 2)
                rec.update(status="ok", metrics=metrics)
            except Exception as e:  # recorded, and the study goes on
                rec.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
            rec["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
            rec["provenance"] = provenance()
            store.append(rec)
            new.append(rec)
            bar.update()
            bar.set_postfix_str(f"last {row.row_id}: {rec['status']}; {sum(r['status'] != 'ok' for r in new)} failed")
    finally:
        bar.close()
    return new


def scratch_model(study: MPPStudyConfig, num_classes: int) -> torch.nn.Module:
    """The scratch initialisation: exactly the weights the MPP runs start from (``train`` seeds with the run's seed,
    then builds the model, the same way), in eval mode. The caller's random state is left as it was."""
    with torch.random.fork_rng(devices=[]):  # built on the CPU: only its generator is seeded, and put back after
        torch.manual_seed(study.seed)
        return build_model(with_model_classes(study.model, num_classes)).eval()


def supervised_model(study: MPPStudyConfig) -> torch.nn.Module:
    """The supervised initialisation as the study uses it: its checkpoint (checked against the study's shape), in
    float32 eval mode."""
    from vitlab.models.checkpoint import load_checkpoint

    return load_checkpoint(_supervised_checkpoint(study)[0]).float().eval()


def _row_metrics(study: MPPStudyConfig, row: StudyRow, run: Path | None, supervised: tuple[Path, ViTConfig, str],
                 data: _Data, dev: torch.device, device: str | None) -> dict[str, Any]:
    from vitlab.models.checkpoint import load_checkpoint

    if row.kind == "finetune":
        init_from = None if row.init == "scratch" else str(supervised[0] if row.init == "supervised" else
                                                             run / "checkpoint")
        return _finetune(study, _finetune_model(study, row.init, supervised), row.seed, init_from, data, device)
    if row.init == "scratch":
        model = scratch_model(study, len(data.train.classes))
    else:
        model = load_checkpoint(supervised[0] if row.init == "supervised" else run / "checkpoint")
    return _few_shot(model, study, data, dev)


# ---------------------------------------------------------------------------------------------- tables, verdicts


def _init_label(spec: dict[str, Any]) -> str:
    init = spec["init"]
    if init == "scratch":
        return "scratch (random init)"
    if init == "supervised":
        return f"supervised ({spec['checkpoint']})"
    p = spec["pretrain"]
    return f"MPP ({p['mpp_target']}, {100 * p['mpp_rate']:g}%, {p['epochs']} epoch{'s' if p['epochs'] != 1 else ''})"


def few_shot_key(readout: str = "model") -> str:
    """The metrics key of an MPP study record's few-shot cells for features read out as ``readout``
    (``vitlab.probe.features.READOUTS``): ``few_shot`` for the model's own readout, ``few_shot_patch_mean`` etc."""
    if readout not in READOUTS:
        raise ValueError(f"readout must be one of {READOUTS}, got {readout!r}")
    return "few_shot" if readout == "model" else f"few_shot_{readout}"


def markdown_tables(records: Sequence[dict], readout: str = "model") -> str:
    """The comparison (one row per initialisation: few-shot accuracy per shot count over probe seeds, fine-tune
    accuracy over seeds) and the ablation (few-shot accuracy per target and corruption rate), in Markdown, from
    one study's records (the latest record of each row, shown when it finished). The few-shot cells are those of
    features read out as ``readout`` (``vitlab.probe.features.READOUTS``). Cells: mean ± std in % on the test images
    (std over probe seeds, or over fine-tune seeds with their count n)."""
    key = few_shot_key(readout)
    ok = [r for r in {r["row_id"]: r for r in records}.values() if r.get("status") == "ok"]
    if len({r["study"] for r in ok}) > 1:
        raise ValueError(f"records of several studies {sorted({r['study'] for r in ok})}: pass one study's records "
                         "(latest_records(records, NAME).values())")
    few = {r["init"]: r for r in ok if r["kind"] == "few_shot" and key in r["metrics"]}
    fine: dict[str, list[dict]] = {}
    for r in ok:
        if r["kind"] == "finetune":
            fine.setdefault(r["init"], []).append(r)
    shots = sorted({int(k) for r in few.values() for k in r["metrics"][key]})
    out = []
    comp = [i for i in INITS if i in few or i in fine]
    if comp:
        spec = next(iter(fine.values()))[0]["spec"] if fine else None
        ft = (f"fine-tune ({spec['per_class']}/class, {spec['finetune']['epochs']} ep.)" if spec else "fine-tune")
        out += ["| initialisation | " + " | ".join(f"{k}-shot" for k in shots) + f" | {ft} |",
                "|---|" + "---|" * (len(shots) + 1)]
        for i in comp:
            label = _init_label((few.get(i) or fine[i][0])["spec"]["init"])
            cells = [percent_cell(few[i]["metrics"][key][str(k)]["per_seed"])
                     if i in few and str(k) in few[i]["metrics"][key] else "" for k in shots]
            tune = sorted(fine.get(i, []), key=lambda r: r["seed"])
            cells.append(percent_cell([r["metrics"]["test_accuracy"] for r in tune]) + f" (n={len(tune)})" if tune else "")
            out.append(f"| {label} | " + " | ".join(cells) + " |")
    abl = [r for i, r in few.items() if i.startswith("ablation:")]
    if abl:
        abl.sort(key=lambda r: (MPP_TARGETS.index(r["spec"]["init"]["pretrain"]["mpp_target"]),
                                -r["spec"]["init"]["pretrain"]["mpp_rate"]))
        if out:
            out.append("")
        out += ["| target | corrupted | pre-training | " + " | ".join(f"{k}-shot" for k in shots) + " |",
                "|---|---|---|" + "---|" * len(shots)]
        for r in abl:
            p = r["spec"]["init"]["pretrain"]
            cells = [percent_cell(r["metrics"][key][str(k)]["per_seed"]) if str(k) in r["metrics"][key] else ""
                     for k in shots]
            out.append(f"| {p['mpp_target']} | {100 * p['mpp_rate']:g}% | {p['epochs']} ep. | " + " | ".join(cells)
                       + " |")
    return "\n".join(out)
