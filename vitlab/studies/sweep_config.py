"""What a data-scaling sweep is, without torch: ``SweepConfig`` (a grid of family x subset size x seed and how
each run is probed), its ``RunSpec`` runs, the model ``FAMILIES``, the named ``SWEEPS`` and ``load_sweep_config``
(a name or a JSON file). ``vitlab.studies.scaling`` runs them and imports every name here back, so that ``from
vitlab.studies.scaling import SweepConfig`` works as before; the command line checks ``--config`` and ``--shots`` with them
before torch loads.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from vitlab.base.checks import check_count, check_int, check_plain_name, check_real, plain_int, whole_index
from vitlab.base.choices import DEFAULT_L2
from vitlab.models.config import BiTConfig, HybridConfig, ViTConfig, cifar_bit, cifar_vit

__all__ = ["SweepConfig", "RunSpec", "FAMILIES", "SWEEPS", "load_sweep_config"]


def _vit(**kw: Any) -> ViTConfig:
    return cifar_vit(**{**dict(embed_dim=128, depth=6, num_heads=4, mlp_dim=256, drop_path_rate=0.0), **kw})


def _bit(**kw: Any) -> BiTConfig:
    # at least 8 channels per GroupNorm group at every width (32 groups on 32 channels would be InstanceNorm)
    return cifar_bit(**{**dict(gn_min_channels_per_group=8), **kw})


# Model families of the sweep: small enough that a grid trains on a CPU in under an hour.
FAMILIES: dict[str, Any] = {
    "vit": lambda: _vit(),  # ViT 6 blocks x 128, 4 px patches: 0.8 M parameters
    "bit": lambda: _bit(channels=(32, 32, 64, 128)),  # BiT-style ResNet-18, narrow; GroupNorm of >= 8 channels
    # hybrid (paper Fig. 5): a narrow GroupNorm ResNet (3 stages of one bottleneck block, stride 4 -> 8x8 tokens)
    # feeding 5 ViT blocks of width 128: about the ViT's and the ResNet's parameter count
    "hybrid": lambda: HybridConfig(vit=_vit(depth=5, patch_size=4), layers=(1, 1, 1), stem="cifar",
                                   channels=(32, 64, 128), gn_min_channels_per_group=8),
    "vit_tiny": lambda: _vit(depth=2, embed_dim=32, num_heads=2, mlp_dim=64),  # for tests
    "bit_tiny": lambda: _bit(layers=(1, 1), channels=(32, 32)),  # for tests
}


@dataclass(frozen=True)
class RunSpec:
    """One run of a sweep: a model family pre-trained on ``size`` images with ``seed``."""

    family: str
    size: int
    seed: int

    @property
    def run_id(self) -> str:
        return f"{self.family}-n{self.size}-s{self.seed}"


@dataclass(frozen=True)
class SweepConfig:
    """A grid of pre-training runs and how each is probed."""

    name: str
    families: tuple[str, ...] = ("vit", "bit")
    sizes: tuple[int, ...] = (250, 500, 1000, 2500, 5000)  # pre-training images (class-balanced, nested): 20x
    seeds: tuple[int, ...] = (0, 1)  # each seed: its own nested subsets, init and data order
    data: str = "cifar10"
    pretrain_classes: tuple[int, ...] = (0, 1, 2, 3, 4)
    probe_classes: tuple[int, ...] = (5, 6, 7, 8, 9)
    epochs: int = 10
    min_steps: int = 150  # small subsets train for more epochs, so every run takes at least this many steps
    batch_size: int = 128
    lr: float = 1e-3
    shots: tuple[int, ...] = (1, 5, 10, 25)
    probe_seeds: tuple[int, ...] = (0, 1, 2)
    l2: float = DEFAULT_L2
    probe_pool_per_class: int = 100  # training examples per probe class the shots are drawn from
    probe_test_per_class: int = 200  # test examples per probe class
    #: per family: (family, optimizer, lr, weight_decay), tuned once on the largest subset (``vitlab.studies.tuning.tune``)
    #: and frozen; a family without an entry trains with AdamW at ``lr`` and weight decay 0.05
    recipes: tuple[tuple[str, str, float, float], ...] = ()
    #: validation images per pre-training class, carved from its training images (never the test images) and kept
    #: out of every subset; each run is reported at its best validation epoch (early stopping, as the paper).
    #: 0: no validation split, the last epoch is reported.
    val_per_class: int = 0
    #: validation passes per run at most: every ceil(epochs / max_evals) epochs and the last (the smallest subsets
    #: train for 150 one-step epochs; validating after each would cost more than the training)
    max_evals: int = 15
    #: provenance of ``recipes``: the ``vitlab.base.provenance.code_hash`` of the code ``vitlab.studies.tuning.tune`` chose them
    #: with (None: not tuned, or a config frozen before this was recorded: unknown). ``run_sweep`` warns when it is not
    #: the current code's. Not part of the fingerprint: it says where the recipes came from, the runs depend on the
    #: recipes only.
    tuned_code: str | None = None
    #: early stopping (``TrainConfig.patience``): each run stops after this many validation passes in a row without a
    #: higher validation accuracy, so its training grows with what its subset still teaches; ``epochs`` and
    #: ``min_steps`` then make its cap (at least ``epochs`` epochs and ``min_steps`` steps), over which the learning
    #: rate's cosine runs. Needs ``val_per_class``. 0: the fixed schedule (``epochs``, at least ``min_steps`` steps).
    #: A run reports its best and its last epoch; one whose best is its last hit the cap still improving
    #: (``vitlab.studies.scaling.best_at_last`` flags it).
    patience: int = 0
    #: with ``patience``: a validation pass every this many training images (rounded up to whole epochs, at least one
    #: epoch), so that small and large subsets are checked at the same amount of training, not every epoch of a
    #: one-step epoch. 0 (and without patience): every ceil(epochs / ``max_evals``) epochs
    eval_images: int = 0
    #: sizes this sweep's design wants but leaves out, each with why: (size, reason). Words for the tables and the
    #: plan, not an input of any run: not part of the fingerprint
    omitted_sizes: tuple[tuple[int, str], ...] = ()

    def recipe(self, family: str) -> tuple[str, float, float]:
        """(optimizer, lr, weight decay) of ``family``."""
        for f, opt, lr, wd in self.recipes:
            if f == family:
                return opt, float(lr), float(wd)
        return "adamw", self.lr, 0.05

    def fingerprint(self) -> str:
        """A hash of every field (``tuned_code`` aside), of the package's source code (``vitlab.base.provenance.code_hash``)
        and, for a data set given as a folder or zip path, of its files (``vitlab.data.datasets.data_fingerprint``): a record
        counts as done only for the exact config, code and data that produced it, so rows from different code or data
        never merge. A named data set (cifar10, shapes) adds nothing: fixed public data, or generated by the code."""
        from vitlab.base.provenance import fingerprint
        from vitlab.data.datasets import data_fingerprint

        config = dataclasses.asdict(self)
        config.pop("tuned_code")  # provenance of the recipes, not an input of the runs
        config.pop("omitted_sizes")  # words, not an input of the runs
        for name in _ADDED_FIELDS:  # at their defaults: the key of a config from before them stays what it was
            if config[name] == _DEFAULTS[name]:
                config.pop(name)
        if self.patience:  # the early-stopping design: a run depends on its own family, size and seed, not on the
            for axis in _GRID_AXES:  # grid's other points, so seeds or sizes added later leave finished runs done
                config.pop(axis)
        key: dict[str, Any] = {"config": config}
        data = data_fingerprint(self.data)
        if data is not None:  # only then: the key of a named data set's config stays what it always was
            key["data"] = data
        return fingerprint(key)

    def runs(self) -> list[RunSpec]:
        """Seed by seed; within a seed, smallest subsets first, every family at one size before the next size.
        A sweep stopped early still has whole curves, for every family, for its first seeds."""
        return [RunSpec(f, n, s) for s in self.seeds for n in sorted(self.sizes) for f in self.families]

    def train_config(self, spec: RunSpec, n: int) -> Any:
        """The ``TrainConfig`` run ``spec`` pre-trains with on its ``n`` images: small subsets train for more epochs,
        so that every run takes at least ``min_steps`` steps."""
        from vitlab.train.config import TrainConfig, with_model_classes

        model = with_model_classes(FAMILIES[spec.family](), len(self.pretrain_classes))
        steps_per_epoch = max(1, n // self.batch_size)
        epochs = max(self.epochs, math.ceil(self.min_steps / steps_per_epoch))
        optimizer, lr, wd = self.recipe(spec.family)
        if self.patience and self.eval_images:
            every = math.ceil(self.eval_images / (steps_per_epoch * min(self.batch_size, n)))
        else:
            every = math.ceil(epochs / self.max_evals) if self.val_per_class else epochs
        return TrainConfig(model=model, data=f"{self.data}[classes {list(self.pretrain_classes)}, n={n}]",
                           epochs=epochs, batch_size=min(self.batch_size, n), lr=lr, weight_decay=wd,
                           optimizer=optimizer, momentum=0.9, warmup_epochs=min(1.0, epochs / 5), mixup_prob=0.0,
                           seed=spec.seed, eval_every=min(every, epochs), keep_best=bool(self.val_per_class),
                           patience=self.patience)

    def __post_init__(self) -> None:
        """Every field checked when the config is made, before any run starts (a bad value would otherwise fail each
        run in turn, and the name, which becomes the results file's name, could step out of its folder); ValueError
        naming the field."""
        check_plain_name("name", self.name)
        if not isinstance(self.data, str) or not self.data:
            raise ValueError(f"data must name a data set (cifar10, shapes) or a folder or zip path, got {self.data!r}")
        for name in ("epochs", "batch_size", "probe_pool_per_class", "probe_test_per_class"):
            check_count(name, getattr(self, name))
        for name in ("min_steps", "val_per_class", "patience", "eval_images"):
            check_int(name, getattr(self, name), 0, allowed="a whole number of at least 0")
        for name in ("lr", "l2"):
            check_real(name, getattr(self, name), lambda v: v > 0, "a positive finite number")
        if self.tuned_code is not None and not isinstance(self.tuned_code, str):
            raise ValueError(f"tuned_code must be a code hash (a string) or null, got {self.tuned_code!r}")
        if not isinstance(self.recipes, tuple) or not all(isinstance(r, tuple) and len(r) == 4 for r in self.recipes):
            raise ValueError("recipes must be a list of [family, optimizer, lr, weight_decay] entries, got "
                             f"{self.recipes!r}")
        if not self.families:  # a sweep of no family would run nothing and report an empty table as done
            raise ValueError(f"families must name at least one model family: choose from {sorted(FAMILIES)}")
        if len(set(self.families)) != len(self.families):
            raise ValueError(f"families names a value twice ({list(self.families)}): each once, or its runs train "
                             "twice under one run id")
        unknown = [f for f in self.families if f not in FAMILIES]
        if unknown:
            raise ValueError(f"unknown model families {unknown}: choose from {sorted(FAMILIES)}")
        classes = tuple(self.pretrain_classes) + tuple(self.probe_classes)
        if (not self.pretrain_classes or not self.probe_classes
                or not all(whole_index(c) and c >= 0 for c in classes)):  # True would pass for class 1, 1.0 too
            raise ValueError("pretrain_classes and probe_classes must be non-empty lists of class indices (whole "
                             f"numbers from 0), got {list(self.pretrain_classes)} and {list(self.probe_classes)}")
        if min(len(self.pretrain_classes), len(self.probe_classes)) < 2:
            raise ValueError("pre-training and probing each need at least 2 classes")
        for name in ("pretrain_classes", "probe_classes"):
            got = list(getattr(self, name))
            if len(set(got)) != len(got):
                raise ValueError(f"{name} names a class twice ({got}): each class once, or its head has an empty class")
        overlap = set(self.pretrain_classes) & set(self.probe_classes)
        if overlap:
            raise ValueError(f"classes {sorted(overlap)} are both pre-training and probe classes: the probe must "
                             "measure transfer to classes the model never saw")
        check_count("max_evals", self.max_evals)  # True is no 1 validation pass
        if self.patience and not self.val_per_class:
            raise ValueError(f"patience={self.patience} stops each run on its validation accuracy: set val_per_class > "
                             "0 (never stop on the test images), or patience 0")
        if not isinstance(self.omitted_sizes, tuple) or not all(
                isinstance(o, tuple) and len(o) == 2 and _python_int(o[0]) and isinstance(o[1], str) and o[1]
                for o in self.omitted_sizes):
            raise ValueError("omitted_sizes must be a list of [size, why it is left out] entries, got "
                             f"{self.omitted_sizes!r}")
        for name, least in (("sizes", 1), ("shots", 1), ("seeds", None), ("probe_seeds", None)):
            got = list(getattr(self, name))  # True is no seed 1 (or 1 shot), 0.5 no seed; a NumPy int no JSON record
            if not got or not all(plain_int(v, least) for v in got):
                at_least = f" of at least {least}" if least is not None else ""
                raise ValueError(f"{name} must be a non-empty list of whole numbers{at_least} (Python ints: no bool, "
                                 f"float or NumPy integer), got {got}")
            if name != "shots" and len(set(got)) != len(got):
                twice = ("its probe draw counts twice and the spread looks smaller than it is" if name == "probe_seeds"
                         else "its runs train twice under one run id")
                raise ValueError(f"{name} names a value twice ({got}): each once, or {twice}")
        if max(self.shots) > self.probe_pool_per_class:
            raise ValueError(f"{max(self.shots)} shots exceed probe_pool_per_class={self.probe_pool_per_class}")
        for family in self.families:  # the training config of a run, as each run builds it (its recipe included)
            entry = next((list(r) for r in self.recipes if r[0] == family), None)
            for n in sorted({min(self.sizes), max(self.sizes)}):
                try:
                    self.train_config(RunSpec(family, n, self.seeds[0]), n)
                except ValueError as e:
                    where = f"recipes entry {entry}" if entry else f"the {family} runs' training config"
                    raise ValueError(f"{where}: {e}") from None


_DEFAULTS = {f.name: f.default for f in dataclasses.fields(SweepConfig)}


def _python_int(v: object) -> bool:
    """Whether ``v`` is a whole number a JSON record holds as it is: a Python int, no bool, float or NumPy integer."""
    return whole_index(v) and isinstance(v, int)


#: fields added after the shipped sweep's records: they enter the fingerprint only when set (``fingerprint``)
_ADDED_FIELDS = ("patience", "eval_images")
#: the grid's axes, which an early-stopping sweep's fingerprint leaves out (``fingerprint``)
_GRID_AXES = ("families", "sizes", "seeds")

#: the CIFAR-10 pre-training classes' whole pool: 5 classes x 5,000 training images, less the validation split of 100
#: per class
CIFAR10_POOL = 5 * 5000 - 5 * 100
WHY_NO_POOL = (f"the whole pool ({CIFAR10_POOL:,} images: every training image of classes 0-4 less the validation "
               "split) is left to a GPU, as issue 48 asks: on the 2-core CPU its runs (up to 2.4 M training images "
               "each at the cap) would add about 70% to the grid's CPU hours (docs/studies.md has the measured plan); "
               "add it to the sizes of a config run on a GPU machine")

SWEEPS: dict[str, SweepConfig] = {
    # three families (paper Fig. 5), six nested sizes over 50x, three seeds, a validation split for the best epoch;
    # recipes are filled by `vitlab sweep --tune` on the largest subset and frozen in a JSON config.
    # Budget (the 3 hours on 2 cores): 147k training images per family and seed (the four smallest subsets
    # train the 150-step minimum), 1.33 M for the grid, plus 0.60 M for tuning (4 recipes x 3 families on the 5,000
    # images): 1.93 M. Measured end to end 2026-11-25 on a 2-core CPU with AVX512-BF16 (bf16, two 1-thread
    # workers): tuning 12 min, grid 26 min, 38.5 min in all. On a 2-core AVX2-only CPU (float32, ~91 images/s per
    # worker for the ViT against ~590 here) the same sweep would take about 3 h (estimated, not run).
    "cifar10": SweepConfig("cifar10", families=("vit", "bit", "hybrid"), sizes=(100, 250, 500, 1000, 2500, 5000),
                           seeds=(0, 1, 2), val_per_class=100),
    # the data-scaling study with the power to decide (issue 48): the same three families, 100 to 10,000 images,
    # 11 seeds paired across families (a seed fixes the nested subset and the probe pool for every family: 11 is the
    # fewest at which the shipped sweep's spread of the gap change gives a 95% half-width of 3 points,
    # vitlab.findings.studies.seeds_for; seeds added later leave the finished runs done), and
    # training that grows with the data: each run stops after 10 validation passes (one every 2,500 training images)
    # without a gain, capped at 100 epochs and at least 3,000 steps (5 passes stopped rising runs on the noise of
    # 500 validation images: docs/studies.md). Plan and measured timing: docs/studies.md.
    "cifar10_10k": SweepConfig("cifar10_10k", families=("vit", "bit", "hybrid"),
                               sizes=(100, 250, 500, 1000, 2500, 5000, 10000), seeds=tuple(range(11)),
                               val_per_class=100, epochs=100, min_steps=3000, patience=10, eval_images=2500,
                               omitted_sizes=((CIFAR10_POOL, WHY_NO_POOL),)),
    "quick": SweepConfig("quick", families=("vit_tiny", "bit_tiny"), sizes=(40, 80), seeds=(0,), data="shapes",
                         pretrain_classes=(0, 1), probe_classes=(2, 3), epochs=1, min_steps=2, batch_size=16,
                         shots=(1, 5), probe_seeds=(0, 1), probe_pool_per_class=10, probe_test_per_class=20),
}


def load_sweep_config(spec: str) -> SweepConfig:
    """A named sweep (``SWEEPS``) or a JSON file of ``SweepConfig`` fields (one written before ``tuned_code`` was
    recorded loads with ``tuned_code=None``: provenance unknown), checked whole (as every ``SweepConfig`` is made); ValueError
    naming the file and the problem otherwise."""
    if spec in SWEEPS:
        return SWEEPS[spec]
    path = Path(spec)
    if not path.is_file():
        what = "no such file" if path.suffix == ".json" else "unknown sweep"  # a misspelt path is no sweep's name
        raise ValueError(f"{what} {spec!r}: use one of {sorted(SWEEPS)} or a JSON file of SweepConfig fields")
    try:
        d = json.loads(path.read_text())
    except json.JSONDecodeError as e:  # the decoder's message names no file
        raise ValueError(f"{path} is not valid JSON ({e}): a sweep config is a JSON object of SweepConfig "
                         "fields") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path} holds a JSON {type(d).__name__}: a sweep config is a JSON object of SweepConfig "
                         'fields, e.g. {"name": "mine", "families": ["vit"]}')
    fields = {f.name for f in dataclasses.fields(SweepConfig)}
    unknown = sorted(set(d) - fields)
    if unknown:
        raise ValueError(f"{path}: unknown fields {unknown}; valid: {sorted(fields)}")
    def frozen(v):
        return tuple(frozen(x) for x in v) if isinstance(v, list) else v

    if "name" not in d:
        raise ValueError(f"{path}: a sweep config needs a name (its results go to runs/sweeps/NAME.jsonl)")
    return SweepConfig(**{k: frozen(v) for k, v in d.items()})  # every field checked, before a run starts
