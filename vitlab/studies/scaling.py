"""Data-scaling curves (paper Fig. 3/4) in miniature: pre-train on nested subsets, score by few-shot probing.

The paper pre-trains ViTs and BiT ResNets on growing subsets of JFT-300M and probes the frozen features
few-shot on ImageNet. The analogue here: pre-train on a class-balanced nested subset of *some* classes of a
dataset (default: CIFAR-10 classes 0-4, from 100 to 5,000 images), then probe the frozen features few-shot
on the *other* classes (5-9), which the model never saw. Limits: 32 px images, four to five orders of magnitude less
data and compute, and transfer between halves of one dataset instead of across datasets, so the curves show
the trend (do ViTs gain more from data than ResNets?), not the paper's numbers.

A sweep is a grid of runs (family x subset size x seed). Every finished run is appended to a JSONL results
store (one line, flushed and fsynced, under a file lock) with its config, metrics and provenance; a failed
run is recorded with its error and the others go on. Running the sweep again skips the runs already done,
so a killed sweep resumes. Executors: ``local`` (a process pool, or in-process with ``workers=0``) and
``ray`` (joins a running cluster by address, or starts a local one). The sweep's config is
``vitlab.studies.sweep_config``'s (torch-free; its names import from here as before). The tuning of each family's recipe,
and the tables that read its trials back, are ``vitlab.studies.tuning``'s.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as dt
import json
import os
import sys
import tempfile
import time
import traceback
import warnings
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch
from tqdm.auto import tqdm

from vitlab.base.checks import check_int
from vitlab.base.errors import ParameterError, Setting
from vitlab.base.provenance import provenance
from vitlab.base.records import append_record, read_records
from vitlab.base.stats import percent_cell
from vitlab.data.datasets import ImageArray, load_splits, nested_subsets
from vitlab.studies.sweep_config import FAMILIES, SWEEPS, RunSpec, SweepConfig, load_sweep_config
from vitlab.train.history import read_history

if TYPE_CHECKING:
    from vitlab.train.config import TrainConfig

__all__ = ["SweepConfig", "RunSpec", "ResultsStore", "FAMILIES", "SWEEPS", "run_one", "run_sweep", "execute_runs",
           "check_executor", "one_config", "summarise", "summarise_compute", "recipe_provenance",
           "RecipeProvenanceWarning", "markdown_table", "load_sweep_config", "best_at_last", "stopping_table",
           "cost_table", "busy_hours", "numerics_line", "FIG7_IMAGES"]


# ---------------------------------------------------------------------------------------------- results store


class ResultsStore:
    """Append-only JSONL (``vitlab.base.records``): one record per finished (or failed) run; the latest record of a run id
    wins."""

    def __init__(self, path: str | os.PathLike) -> None:
        self.path = Path(path)

    def records(self) -> list[dict]:
        """Every record in file order (none for a missing file), under ``vitlab.base.records.read_records``'s torn-line
        policy: a torn last line is left out with a warning (that run reruns), any other line that is no record is a
        ``RecordFileError``."""
        if not self.path.exists():
            return []
        return read_records(self.path, torn_fix="That run reruns", what="a results store", param="results")

    def latest(self, sweep: str | None = None, fingerprint: str | None = None) -> dict[str, dict]:
        """{run_id: latest record} of one sweep (all sweeps when ``sweep`` is None; then later sweeps' records
        replace earlier ones of the same run id), optionally only records made with config ``fingerprint``."""
        return {r["run_id"]: r for r in self.records()
                if (sweep is None or r.get("sweep") == sweep)
                and (fingerprint is None or r.get("fingerprint") == fingerprint)}

    def newest_sweep(self) -> dict[str, dict]:
        """{run_id: latest record} of the sweep and config (fingerprint) that finished a run successfully last: one
        sweep's records, never rows of an earlier config (other code, another recipe) mixed into a figure.
        ``newest_sweep_with_note`` also says which newer configs it skipped (they have no finished run)."""
        return self.newest_sweep_with_note()[0]

    def newest_sweep_with_note(self) -> tuple[dict[str, dict], str]:
        """``newest_sweep()`` and a sentence saying which sweep and config it is and which newer configs it skipped
        because none of their runs finished (a newer config whose only run failed would show no runs at all). With
        no finished run in the store: the newest config's records (all failed)."""
        records = self.records()
        if not records:
            return {}, f"no records in {self.path}"
        when = lambda r: r.get("finished") or ""  # noqa: E731
        config = lambda r: (r.get("sweep"), r.get("fingerprint"))  # noqa: E731
        ok = [r for r in records if r.get("status") == "ok"]
        pick = config(max(ok or records, key=when))
        chosen = self.latest(*pick)
        note = (f"sweep {pick[0]!r}, config {pick[1]}: {sum(r.get('status') == 'ok' for r in chosen.values())} of "
                f"{len(chosen)} runs finished")
        newest = max(when(r) for r in chosen.values())
        newer: dict[tuple, int] = {}
        for r in records:
            if config(r) != pick and when(r) > newest:
                newer[config(r)] = newer.get(config(r), 0) + 1
        if not ok:
            note += " (no run of any config in the store finished)"
        elif newer:
            note += "; skipped newer config(s) with no finished run: " + ", ".join(
                f"sweep {s!r} config {f} ({n} failed record(s))" for (s, f), n in newer.items())
        return chosen, note

    def done(self, sweep: str | None = None, fingerprint: str | None = None) -> set[str]:
        """Run ids whose latest record (of ``sweep`` and config ``fingerprint``) finished."""
        return {k for k, r in self.latest(sweep, fingerprint).items() if r["status"] == "ok"}

    def check_writable(self) -> None:
        """Before the first run: make the store's folder and open it for appending (an empty file where there was
        none), so that a store that cannot take a record (a file where its folder should be, a read-only folder)
        fails now, naming it, not after a run's work, whose record would be lost."""
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab"):
            pass

    def append(self, record: dict) -> None:
        """Append ``record`` as one line (``vitlab.base.records.append_record``: locked, fsynced, a torn last line dropped
        first)."""
        append_record(self.path, record, sort_keys=True)


# ---------------------------------------------------------------------------------------------- one run


def _classes(data: ImageArray, classes: Sequence[int], per_class: int | None = None, seed: int = 0) -> ImageArray:
    """The examples of ``classes``, relabelled 0..len(classes)-1, optionally ``per_class`` of each."""
    keep = torch.isin(data.labels, torch.tensor(list(classes)))
    idx = torch.nonzero(keep).flatten()
    sub = data.subset(idx)
    remap = torch.full((int(data.labels.max()) + 1,), -1, dtype=torch.long)
    remap[torch.tensor(list(classes))] = torch.arange(len(classes))
    sub = ImageArray(sub.images, remap[sub.labels], tuple(data.classes[c] for c in classes),
                     f"{data.source}[classes {list(classes)}]", sub.masks)
    if per_class is not None:
        sub = sub.subset(nested_subsets(sub.labels, [min(per_class * len(classes), len(sub))], seed=seed)[0])
    return sub


def _train_config(sweep: SweepConfig, spec: RunSpec, n: int):
    return sweep.train_config(spec, n)


def run_one(sweep: SweepConfig, spec: RunSpec, work_dir: str | os.PathLike | None = None,
            device: str | None = None) -> dict:
    """Pre-train one model on its nested subset, probe it few-shot on the held-out classes: the metrics."""
    from vitlab.probe.features import extract_features
    from vitlab.probe.linear import few_shot_accuracy

    t0, cpu_start = time.time(), time.process_time()
    full_train, full_test = load_splits(sweep.data, progress=False)  # the same classes in both splits; a worker
    # draws no bar of its own (the sweep's bar counts runs)
    subset, picked, val, pre_test = _pretrain_splits(sweep, spec, full_train, full_test)
    cfg = _train_config(sweep, spec, spec.size)
    if _has_fig7(cfg.model):  # read now: a missing sample fails the run at once, not after its training
        from vitlab.data.images import cifar_test_sample

        cifar_test_sample()
    cpu0 = time.process_time()
    model, log, best = _pretrain(cfg, subset, val, pre_test, spec, work_dir, device)
    train_cpu = time.process_time() - cpu0
    model.eval()
    flops_per_step = _flops_per_step(cfg, model, subset)
    last_epoch = int(log[-1]["epoch"])  # the cap, or the epoch early stopping stopped at
    steps = last_epoch * (spec.size // cfg.batch_size)
    probe_train = _classes(full_train, sweep.probe_classes, sweep.probe_pool_per_class, seed=spec.seed)
    probe_test = _classes(full_test, sweep.probe_classes, sweep.probe_test_per_class, seed=0)
    ftr = extract_features(model, probe_train, cache=False, progress=False)
    fte = extract_features(model, probe_test, cache=False, progress=False)
    fs = few_shot_accuracy(ftr, probe_train.labels, fte, probe_test.labels, shots=sweep.shots,
                           seeds=sweep.probe_seeds, l2=sweep.l2)
    fig7 = _fig7(model, cfg.model)
    return {
        "last_epoch": last_epoch,  # with "best": the best validation epoch against the last one trained
        "stopped_early": "early_stop" in log[-1],
        "evaluations": sum("val_accuracy" in x or "test_accuracy" in x for x in log),
        # [epoch, validation accuracy] of every validation pass (the split ``_pretrain`` trains against as its test
        # data): what early stopping saw, for questions asked after the study (a later best with more patience?)
        # without training again; None without a validation split
        "val_curve": [[int(x["epoch"]), x["test_accuracy"]] for x in log if "test_accuracy" in x]
        if val is not None else None,
        "subset_digest": _digest(picked),  # the same for every family of a seed: the pairing, checkable
        "probe_pool_digest": _digest(probe_train.images),
        **({"fig7": fig7, "fig7_images": FIG7_IMAGES} if fig7 is not None else {}),
        "cpu_seconds": round(time.process_time() - cpu_start, 2),  # the whole run: data, training, Fig. 7, probe
        "threads": torch.get_num_threads(),
        "bf16": _trained_in_bf16(cfg, model),  # the numerics this machine gave it: not in the fingerprint
        "few_shot": {str(k): {"mean": r.mean, "std": r.std, "per_seed": list(r.per_seed)} for k, r in fs.items()},
        "pretrain_test_accuracy": log[-1].get("test_accuracy") if val is None else None,
        "best": best,  # {"epoch", "val_accuracy"} of the reported model, with a validation split
        "pretrain_final_loss": log[-1]["train_loss"],
        "epochs": cfg.epochs,  # the cap, with early stopping
        "steps": steps,  # trained: up to the last epoch
        "recipe": dict(zip(("optimizer", "lr", "weight_decay"), sweep.recipe(spec.family))),
        "pretrain_flops": flops_per_step * steps,  # FlopCounterMode on one step, times the steps
        "train_cpu_seconds": round(train_cpu, 2),
        "parameters": sum(p.numel() for p in model.parameters()),
        "train_seconds": round(sum(x["epoch_seconds"] for x in log), 2),
        "seconds": round(time.time() - t0, 2),
    }


def _trained_in_bf16(cfg: TrainConfig, model: torch.nn.Module) -> bool:
    """Whether the run trained under bf16 autocast: as ``vitlab.train.loop.train`` decides it, from the config and
    the device (``vitlab.base.precision.use_bf16``: an AVX2-only CPU trains in float32), so the same config and code
    give bf16 runs on one machine and float32 runs on another."""
    from vitlab.base.precision import use_bf16

    return use_bf16(cfg.bf16, next(model.parameters()).device)


def _pretrain_splits(sweep: SweepConfig, spec: RunSpec, full_train: ImageArray,
                     full_test: ImageArray) -> tuple[ImageArray, torch.Tensor, ImageArray | None, ImageArray]:
    """``(subset, picked, val, pre_test)`` of a run: its nested subset of the pre-training classes' training images
    (``picked``: their indices, the seed's, every family's), the fixed validation split (None without
    ``val_per_class``) and the pre-training classes' test images. Raises ValueError for a class the data lacks or
    a subset larger than the images."""
    from vitlab.train.loop import validation_split

    missing = sorted(set(sweep.pretrain_classes + sweep.probe_classes) - set(range(len(full_train.classes))))
    if missing:
        raise ValueError(f"classes {missing} do not exist in {sweep.data}, which has {len(full_train.classes)} classes")
    pre = _classes(full_train, sweep.pretrain_classes)
    if spec.size > len(pre):
        raise ValueError(f"subset size {spec.size} exceeds the {len(pre)} pre-training images of classes "
                         f"{list(sweep.pretrain_classes)}")
    pre_test = _classes(full_test, sweep.pretrain_classes)
    val = None
    if sweep.val_per_class:  # a fixed validation split of the pre-training classes' training images
        pre, val = validation_split(pre, sweep.val_per_class)
        if spec.size > len(pre):
            raise ValueError(f"subset size {spec.size} exceeds the {len(pre)} pre-training images left after the "
                             f"validation split")
    picked = nested_subsets(pre.labels, [spec.size], seed=spec.seed)[0]  # the seed's subset, every family's
    return pre.subset(picked), picked, val, pre_test


def _pretrain(cfg: TrainConfig, subset: ImageArray, val: ImageArray | None, pre_test: ImageArray, spec: RunSpec,
              work_dir: str | os.PathLike | None, device: str | None) -> tuple[torch.nn.Module, list[dict], dict | None]:
    """Train ``cfg`` on ``subset`` in a temporary run folder under ``work_dir``, evaluating on
    ``val`` (else ``pre_test``): ``(model, history, best)``, with a validation split the model of the best
    validation epoch and ``best`` = ``{"epoch", "val_accuracy"}`` (else the last model and None)."""
    from vitlab.train.loop import train

    with tempfile.TemporaryDirectory(dir=work_dir, prefix=f"{spec.run_id}.") as tmp:
        # eager, as the first sweep's runs (all under COMPILE_MIN_STEPS) trained: an early-stopped run's length is
        # unknown at its start (its cap decided compiling for the ViT alone), and compiling costs minutes of CPU per
        # run that a short run never earns back
        model = train(cfg, Path(tmp) / "run", progress=False, train_data=subset,
                      test_data=val if val is not None else pre_test, device=device, compile=False)
        log = read_history(Path(tmp) / "run")
        best = None
        if val is not None:  # the model at its best validation epoch, as the paper reports each run
            from vitlab.models.checkpoint import load_checkpoint

            best_meta = json.loads((Path(tmp) / "run" / "best" / "config.json").read_text())
            model = load_checkpoint(Path(tmp) / "run" / "best").to(next(model.parameters()).device)
            best = {"epoch": best_meta["epoch"], "val_accuracy": best_meta["metrics"]["test_accuracy"]}
    return model, log, best


def _flops_per_step(cfg: TrainConfig, model: torch.nn.Module, subset: ImageArray) -> float:
    """FLOPs of one training step of ``cfg``'s model (built afresh) on the first batch of ``subset``, at the
    training's precision (``vitlab.train.loop.step_flops``)."""
    from vitlab.base.precision import use_bf16
    from vitlab.data.datasets import normalize
    from vitlab.models.zoo import build_model as vitlab_build
    from vitlab.train.loop import step_flops

    pc = model.pretrained_cfg
    xb = normalize(subset.images[: cfg.batch_size], pc["mean"], pc["std"])
    return step_flops(vitlab_build(cfg.model), xb, subset.labels[: cfg.batch_size],
                      bf16=use_bf16(cfg.bf16, xb.device))  # the same count, at the training's speed


#: how many of the 128 shipped CIFAR-10 test images the Fig. 7 statistics of a run read (``vitlab.train.emergence``)
FIG7_IMAGES = 128


def _has_fig7(config: Any) -> bool:
    """Whether a run of the model of ``config`` records Fig. 7 statistics: a ViT or a hybrid (a ResNet has no
    attention)."""
    from vitlab.models.config import HybridConfig, ViTConfig

    return isinstance(config, (ViTConfig, HybridConfig))


def _fig7(model: torch.nn.Module, config: Any) -> dict | None:
    """``vitlab.train.emergence.fig7_statistics`` of a ViT or hybrid (the model of ``config``) on the fixed sample of
    ``FIG7_IMAGES`` shipped test images, on the model's device; None for another model (``_has_fig7``)."""
    from vitlab.train.emergence import fig7_statistics, sample_batch

    if not _has_fig7(config):
        return None
    return fig7_statistics(model, sample_batch(model, FIG7_IMAGES).to(next(model.parameters()).device))


def _digest(t: torch.Tensor) -> str:
    """A short hash of a tensor's values (the indices of a subset, a probe pool's labels): equal tensors, equal
    digests."""
    import hashlib

    return hashlib.sha256(t.detach().cpu().contiguous().numpy().tobytes()).hexdigest()[:12]


def _run_record(sweep: SweepConfig, spec: RunSpec, work_dir: str | None, threads: int | None,
                fingerprint: str | None = None, code: str | None = None) -> dict:
    """``run_one`` wrapped for executors: never raises; the record carries either metrics or the error.

    ``fingerprint``: the run's fingerprint as the process that started the sweep computed it (the record is matched
    against that one; a worker process recomputing it would hash its own import of the code). ``code``: that
    process's ``code_hash``; a worker whose own differs (the package's files changed after the sweep started, and
    the worker imported the changed files) records a failure instead of running other code under the fingerprint.
    ``threads``: torch's intra-op threads for the run (None: as they are), restored afterwards (``_torch_threads``)."""
    started = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    rec: dict[str, Any] = {"sweep": sweep.name, "run_id": spec.run_id, "spec": dataclasses.asdict(spec),
                           "config": dataclasses.asdict(sweep),
                           "fingerprint": fingerprint if fingerprint is not None else sweep.fingerprint(),
                           "started": started}
    with _torch_threads(threads):
        try:
            with _worker_code_checked(code):
                metrics = run_one(sweep, spec, work_dir)
            rec.update(status="ok", metrics=metrics)
        except Exception as e:  # recorded, and the sweep goes on
            rec.update(status="failed", error=f"{type(e).__name__}: {e}", traceback=traceback.format_exc(limit=8))
        rec["finished"] = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
        rec["provenance"] = provenance()  # with the run's thread count
    return rec


@contextlib.contextmanager
def _torch_threads(threads: int | None) -> Iterator[None]:
    """torch's intra-op thread count set to ``threads`` for the body (None: left as it is) and set back after it, so
    that a run in a process that goes on (a Ray worker's next task, a caller running ``_run_record`` itself) leaves
    that process's own count as it was."""
    if not threads:
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _vitlab_modules() -> set[str]:
    return {name for name in sys.modules if name == "vitlab" or name.startswith("vitlab.")}


_RUN_ELSEWHERE = ("Run the sweep from a checkout nobody edits (e.g. `git worktree add ../snapshot HEAD`) and start it "
                  "again: finished runs are skipped")


@contextlib.contextmanager
def _worker_code_checked(code: str | None) -> Iterator[None]:
    """Run the body only if this process runs the code of the sweep's parent process (``code``: its ``code_hash``;
    None: not checked), and fail it afterwards if it may not have.

    Before: this process imported vitlab from files whose hash is ``code``. After: a vitlab module first imported
    during the body (the training code imports some lazily) was read from the files as they were then; when the
    package's files no longer hash to ``code`` at the end, such a module may be other code, and the body's result is
    refused. A body that imported nothing new ran only the checked code, whatever the files hold now."""
    if code is None:
        yield
        return
    from vitlab.base import provenance as prov

    mine = prov.code_hash()
    if mine != code:
        raise RuntimeError(f"this worker imported vitlab code {mine}, but the sweep started with code {code}: the "
                           "package's files changed after the sweep started (an edit, a checkout), so this run would "
                           f"be made by other code than its fingerprint records. {_RUN_ELSEWHERE}")
    before = _vitlab_modules()
    yield
    late = sorted(_vitlab_modules() - before)
    now = prov.source_hash() if late else code
    if now != code:
        raise RuntimeError(f"this run imported {', '.join(late)} while the package's files changed (they hash to "
                           f"{now}, the sweep started with code {code}: an edit, a checkout), so it may have been "
                           f"made by other code than its fingerprint records; its result is not kept. {_RUN_ELSEWHERE}")


def _crashed_record(sweep: SweepConfig, spec: RunSpec, fingerprint: str, error: BaseException) -> dict:
    now = dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    return {"sweep": sweep.name, "run_id": spec.run_id, "spec": dataclasses.asdict(spec),
            "config": dataclasses.asdict(sweep), "fingerprint": fingerprint, "started": None,
            "finished": now, "status": "failed", "error": f"worker crashed: {type(error).__name__}: {error}",
            "provenance": provenance()}


# ---------------------------------------------------------------------------------------------- executors


@contextlib.contextmanager
def _ray_runtime(address: str | None, workers: int) -> Iterator[Any]:
    try:
        import ray
    except ImportError as e:
        raise ParameterError("executor", "ray", problem="needs Ray", fix=[
            "pip install 'vitlab[ray]' (or pip install ray)", Setting("executor", "local")]) from e
    started = not ray.is_initialized()
    if started:
        if address:
            ray.init(address=address, log_to_driver=False)
        else:
            ray.init(num_cpus=max(1, workers), include_dashboard=False, log_to_driver=False,
                     runtime_env={"env_vars": {"VITLAB_CACHE": os.environ.get("VITLAB_CACHE", "")}}
                     if os.environ.get("VITLAB_CACHE") else None)
    try:
        yield ray
    finally:
        if started:
            ray.shutdown()


def run_sweep(sweep: SweepConfig, results: str | os.PathLike, executor: str = "local", workers: int = 1,
              address: str | None = None, work_dir: str | os.PathLike | None = None,
              progress: bool | None = None, hours: float | None = None) -> list[dict]:
    """Run every run of ``sweep`` not yet in ``results`` and append its record there; returns the new records.

    ``executor``: ``"local"`` (``workers`` processes; 0 runs in this process) or ``"ray"`` (``address`` of a
    running cluster, or a local runtime with ``workers`` CPUs). Each worker gets cpu_count/workers threads.
    ``hours``: start no run after this many hours (the runs in flight finish and are recorded), so that a long sweep
    runs in sessions: run it again to go on (local executor only; ValueError otherwise, or for hours <= 0).
    """
    check_executor(executor, workers)
    if hours is not None and (isinstance(hours, bool) or not isinstance(hours, (int, float)) or not hours > 0
                              or executor != "local"):
        raise ValueError(f"hours must be a number of hours > 0 with the local executor (ray starts every run at once), "
                         f"got {hours!r} with executor {executor!r}")
    deadline = None if hours is None else _clock() + 3600 * hours
    note = recipe_provenance(sweep)
    if note:
        warnings.warn(note, RecipeProvenanceWarning, stacklevel=2)
    store = ResultsStore(results)
    done = store.done(sweep.name, sweep.fingerprint())
    todo = [s for s in sweep.runs() if s.run_id not in done]
    stale = {r.get("fingerprint") for r in store.latest(sweep.name).values()} - {sweep.fingerprint()}
    if progress is not False:
        print(f"sweep {sweep.name}: {len(done)} of {len(sweep.runs())} runs already done with this config and code, "
              f"skipped; {len(todo)} to run" + (f"; rows from other code or config (fingerprints {sorted(stale)}) are "
                                                "kept in the store but not counted" if stale else ""), file=sys.stderr)
    if todo:
        store.check_writable()
    new: list[dict] = []
    bar = tqdm(total=len(todo), desc=f"sweep {sweep.name}", disable=progress is False)

    def finish(rec: dict) -> None:
        store.append(rec)
        new.append(rec)
        failed = sum(r["status"] != "ok" for r in new)
        running = min(max(1, workers), len(todo) - len(new))
        bar.set_postfix_str(f"last {rec['run_id']}: {rec['status']}; {running} running, {failed} failed")  # tqdm: ETA
        bar.update()

    try:
        execute_runs([(sweep, spec) for spec in todo], finish, executor, workers, address, work_dir, deadline)
    finally:
        bar.close()
    if progress is not False and deadline is not None and len(new) < len(todo):
        print(f"sweep {sweep.name}: {hours:g} h are up; {len(todo) - len(new)} runs not started: run the same command "
              "again to go on", file=sys.stderr)
    return new


def _clock() -> float:
    """Seconds since the epoch: the clock of ``run_sweep``'s ``hours`` (a test replaces it)."""
    return time.time()


class RecipeProvenanceWarning(UserWarning):
    """A sweep's frozen recipes were tuned with other code than the current, or with code nobody recorded."""


def recipe_provenance(sweep: SweepConfig) -> str | None:
    """What is known against ``sweep``'s recipes (``SweepConfig.tuned_code``): None when they were tuned with the
    current code (or there are none), else a sentence saying which code tuned them, or that nobody recorded it."""
    from vitlab.base import provenance as prov

    if not sweep.recipes:
        return None
    now = prov.code_hash()
    if sweep.tuned_code is None:
        return (f"the recipes of sweep {sweep.name!r} do not record the code they were tuned with (a config frozen "
                "before vitlab recorded it): their provenance is unknown. Re-tune with vitlab.studies.tuning.tune "
                "(`vitlab sweep --config ... --tune`) to freeze them with it")
    if sweep.tuned_code != now:
        return (f"the recipes of sweep {sweep.name!r} were tuned with vitlab code {sweep.tuned_code}, and this is code "
                f"{now}: tuning now might choose others. Re-tune with vitlab.studies.tuning.tune (`vitlab sweep --config ... "
                "--tune`; the trials rerun under the new code), or go on knowing the recipes are the old code's")
    return None


def check_executor(executor: str, workers: int) -> None:
    """Refuse an executor ``run_sweep`` and ``vitlab.studies.tuning.tune`` do not know, or a negative worker count, before any
    run starts."""
    if executor not in ("local", "ray"):
        raise ValueError(f"executor must be 'local' or 'ray', got {executor!r}")
    # 1.5 is no process count, True no 1
    check_int("workers", workers, 0, allowed="a whole number >= 0 (0: runs in this process)", numpy=True)


def execute_runs(jobs: Sequence[tuple[SweepConfig, RunSpec]], finish, executor: str = "local", workers: int = 1,
                 address: str | None = None, work_dir: str | os.PathLike | None = None,
                 deadline: float | None = None) -> None:
    """Run each (sweep, run) of ``jobs`` with ``executor`` (as ``run_sweep`` describes) and call ``finish(record)``
    in this process as each ends, in the order they end; a worker that dies gives a failed record. ``deadline``
    (a ``time.time()``; local executor): no run starts after it. Each record's
    fingerprint is computed here, in this process, and each worker refuses to run when the code it imported is not
    this process's (``_run_record``)."""
    from vitlab.base import provenance as prov

    if not jobs:
        return
    if work_dir is not None:
        Path(work_dir).mkdir(parents=True, exist_ok=True)
    wd = None if work_dir is None else str(work_dir)
    threads = max(1, (os.cpu_count() or 1) // max(1, workers))
    code = prov.code_hash()
    prints: dict[int, str] = {}  # one fingerprint per config object (it may read a data folder's listing); by id, as
    for sweep, _ in jobs:  # a config with list fields (sizes=[...]) is not hashable
        if id(sweep) not in prints:
            prints[id(sweep)] = sweep.fingerprint()
    triples = [(sweep, spec, prints[id(sweep)]) for sweep, spec in jobs]
    past = (lambda: False) if deadline is None else (lambda: _clock() >= deadline)
    if executor == "local" and workers == 0:
        for sweep, spec, fp in triples:
            if past():
                break
            finish(_run_record(sweep, spec, wd, None, fp, code))
    elif executor == "local":
        _execute_local(triples, finish, workers, wd, threads, code, past)
    else:
        with _ray_runtime(address, workers) as ray:
            remote = ray.remote(num_cpus=1, max_retries=0)(_run_record)
            refs = {remote.remote(sweep, spec, wd, threads, fp, code): (sweep, spec, fp) for sweep, spec, fp in triples}
            pending = list(refs)
            while pending:
                ready, pending = ray.wait(pending, num_returns=1)
                try:
                    finish(ray.get(ready[0]))
                except Exception as e:  # the worker died or the task could not run: record it
                    finish(_crashed_record(*refs[ready[0]], e))


def _execute_local(queue: list[tuple[SweepConfig, RunSpec, str]], finish, workers: int, wd: str | None,
                   threads: int, code: str | None = None, past=lambda: False) -> None:
    """Process pool, at most ``workers`` runs in flight. A worker that dies (out of memory, a signal) breaks the
    pool: the runs in flight then are recorded as crashed (a resume reruns them) and the runs not yet started go
    on in a new pool, instead of every pending run failing with the broken pool. Each worker ends when this process
    ends, however it ends (``vitlab.base.processes.die_with_parent``), and when this function raises (SIGTERM:
    ``_workers_killed_on_error``)."""
    import concurrent.futures as cf
    import multiprocessing as mp
    from concurrent.futures.process import BrokenProcessPool

    from vitlab.base.processes import die_with_parent

    while queue and not past():  # past(): no run starts after the deadline
        # a worker dies with this process: killed (kill -9, a session's end), it would otherwise finish its run, whose
        # record nobody writes, beside the next session's workers, and then wait forever
        with cf.ProcessPoolExecutor(max_workers=workers, mp_context=mp.get_context("spawn"),
                                    initializer=die_with_parent, initargs=(os.getpid(),)) as pool, \
                _workers_killed_on_error(pool):
            running: dict[cf.Future, tuple[SweepConfig, RunSpec, str]] = {}
            broken, submitted = False, 0
            while (queue or running) and not broken:
                while queue and len(running) < workers and not broken and not past():
                    try:
                        sweep, spec, fp = queue[0]
                        running[pool.submit(_run_record, sweep, spec, wd, threads, fp, code)] = queue[0]
                    except BrokenProcessPool as e:  # a worker died since the last wait: the run waits for a new
                        broken = True  # pool, unless this pool never took one (then it is recorded: no endless loop)
                        if not submitted:
                            finish(_crashed_record(*queue.pop(0), e))
                    else:
                        queue.pop(0)
                        submitted += 1
                if not running:
                    break
                done, _ = cf.wait(running, return_when=cf.FIRST_COMPLETED)
                for fut in done:
                    broken |= _settle(fut, running.pop(fut), finish)
            for fut, job in running.items():  # in flight when the pool broke: a finished one keeps its record
                _settle(fut, job, finish)


@contextlib.contextmanager
def _workers_killed_on_error(pool) -> Iterator[None]:
    """Kill ``pool``'s worker processes when the body raises (SIGTERM, as the command raises it, Ctrl-C, a record
    that cannot be stored), before the pool's own exit, which would otherwise wait for the runs in flight to finish
    (hours at a study's largest size) only to drop their records."""
    try:
        yield
    except BaseException:
        for proc in list((getattr(pool, "_processes", None) or {}).values()):
            proc.kill()
        raise


def _settle(fut, job: tuple[SweepConfig, RunSpec, str], finish) -> bool:
    """``finish`` the run's record, or a crashed record when its worker died; True when the pool broke."""
    from concurrent.futures.process import BrokenProcessPool

    try:
        finish(fut.result())
    except BrokenProcessPool as e:
        finish(_crashed_record(*job, e))
        return True
    except Exception as e:  # noqa: BLE001 - the run could not be sent or returned: record it
        finish(_crashed_record(*job, e))
    return False


def one_config(records: Sequence[Mapping]) -> None:
    """Refuse records of more than one sweep config (fingerprint: the code and the recipe that made them), which
    a table, figure or verdict would mix."""
    prints = {r.get("fingerprint") for r in records}
    if len(prints) > 1:
        raise ValueError(f"records of {len(prints)} sweep configs ({sorted(map(str, prints))}): select one, e.g. "
                         "ResultsStore(path).newest_sweep().values(), or rerun the sweep")


def summarise(records: Sequence[dict], shots: int = 10) -> dict[str, dict[int, dict[str, float]]]:
    """{family: {size: {"mean", "std", "n", "values"}}} of the ``shots``-shot accuracy over seeds (ok runs only;
    sample std)."""
    import numpy as np

    one_config([r for r in records if r.get("status") == "ok"])
    acc: dict[str, dict[int, list[float]]] = {}
    for r in records:
        if r.get("status") != "ok" or str(shots) not in r["metrics"]["few_shot"]:
            continue
        acc.setdefault(r["spec"]["family"], {}).setdefault(r["spec"]["size"], []).append(
            r["metrics"]["few_shot"][str(shots)]["mean"])
    return {fam: {n: {"mean": float(np.mean(v)), "std": float(np.std(v, ddof=1)) if len(v) > 1 else 0.0, "n": len(v),
                      "values": list(v)} for n, v in sorted(by.items())} for fam, by in acc.items()}


def summarise_compute(records: Sequence[dict]) -> dict[str, dict[int, float]]:
    """{family: {size: mean pre-training FLOPs}} over the finished runs that recorded them."""
    out: dict[str, dict[int, list[float]]] = {}
    for r in records:
        flops = r.get("metrics", {}).get("pretrain_flops") if r.get("status") == "ok" else None
        if flops:
            out.setdefault(r["spec"]["family"], {}).setdefault(r["spec"]["size"], []).append(flops)
    return {f: {n: sum(v) / len(v) for n, v in sorted(by.items())} for f, by in out.items()}


def markdown_table(summary: dict[str, dict[int, dict[str, float]]]) -> str:
    """The README table of a sweep: one row per family, one column per size, "mean ± std" in % over seeds
    (``vitlab.base.stats.percent_cell`` of ``summarise``'s values)."""
    sizes = sorted({n for by in summary.values() for n in by})
    lines = ["| family | " + " | ".join(f"{n:,}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for fam, by in summary.items():
        cells = [percent_cell(by[n]["values"]) if n in by else "" for n in sizes]
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------------------- training and cost


def _ok(records: Sequence[Mapping]) -> list[Mapping]:
    return [r for r in records if r.get("status") == "ok"]


def _last_epoch(m: Mapping) -> int | None:
    """The last epoch a run trained: recorded since early stopping, else its schedule's (``epochs``); None for a record
    with neither."""
    last = m.get("last_epoch", m.get("epochs"))
    return None if last is None else int(last)


def best_at_last(records: Sequence[Mapping]) -> list[str]:
    """The run ids (finished runs with a best validation epoch) whose best epoch is their last: runs that stopped
    while still improving, where more training might have changed the result. Sorted."""
    return sorted(r["run_id"] for r in _ok(records) if _last_epoch(r["metrics"]) is not None
                  and (r["metrics"].get("best") or {}).get("epoch") == _last_epoch(r["metrics"]))


def _grid(records: Sequence[Mapping], cell) -> tuple[list[int], dict[str, dict[int, list]]]:
    """(sizes, {family: {size: [cell(metrics) of each finished run]}}), families in the order first met."""
    out: dict[str, dict[int, list]] = {}
    for r in _ok(records):
        out.setdefault(r["spec"]["family"], {}).setdefault(int(r["spec"]["size"]), []).append(cell(r["metrics"]))
    return sorted({n for by in out.values() for n in by}), out


def numerics_line(records: Sequence[Mapping]) -> str:
    """One sentence: how many finished runs trained in bf16 and how many in float32 (``metrics["bf16"]``; the
    machine decides it, the fingerprint does not hold it), "MIXED" when both occur, so that a study run in sessions on
    machines of different CPUs shows it; runs from before it was recorded counted apart."""
    flags = [r["metrics"].get("bf16") for r in _ok(records)]
    bf16, fp32, unknown = flags.count(True), flags.count(False), sum(f is None for f in flags)
    line = f"Training numerics: {bf16} run(s) in bf16, {fp32} in float32" + (f", {unknown} not recorded" if unknown
                                                                             else "")
    return line + (" (MIXED: the runs' numerics differ by machine; compare them knowing it)" if bf16 and fp32
                   else "")


def stopping_table(records: Sequence[Mapping]) -> str:
    """Markdown: per family and size, the runs' best / last epoch (medians over seeds) and how many runs stopped
    early; then a line naming every run whose best epoch is its last (``best_at_last``), or saying there is none."""
    import numpy as np

    sizes, grid = _grid(records, lambda m: ((m.get("best") or {}).get("epoch"), _last_epoch(m),
                                            bool(m.get("stopped_early"))))
    lines = ["| family | " + " | ".join(f"{n:,}" for n in sizes) + " |", "|---|" + "---|" * len(sizes)]
    for fam, by in grid.items():
        cells = []
        for n in sizes:
            runs = [x for x in by.get(n, []) if x[1] is not None]  # records with a last epoch
            best = [b for b, _, _ in runs if b is not None]
            cells.append(f"{np.median(best):g} / {np.median([x for _, x, _ in runs]):g} ({sum(s for *_, s in runs)} of "
                         f"{len(runs)} stopped)" if runs and best else "")
        lines.append(f"| {fam} | " + " | ".join(cells) + " |")
    flagged = best_at_last(records)
    lines.append("")
    lines.append(f"Best epoch = last epoch (stopped while still improving): {len(flagged)} run(s)"
                 + (": " + ", ".join(flagged) if flagged else ""))
    return "\n".join(lines)


def _when(stamp: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(stamp) if stamp else None


def busy_hours(records: Sequence[Mapping]) -> float:
    """Hours during which at least one of ``records`` (with ``started`` and ``finished`` timestamps) was in flight:
    the union of their intervals, so that runs in parallel count once and the gaps between sessions not at all. 0.0
    for none."""
    spans = sorted((a, b) for a, b in ((_when(r.get("started")), _when(r.get("finished"))) for r in records) if a and b)
    total, end = 0.0, None
    for a, b in spans:
        if end is None or a > end:
            total, end = total + (b - a).total_seconds(), b
        elif b > end:
            total, end = total + (b - end).total_seconds(), b
    return total / 3600


def _cpu_hours(records: Sequence[Mapping], key: str = "cpu_seconds") -> float:
    return sum(float(r["metrics"].get(key) or 0.0) for r in _ok(records)) / 3600


def cost_table(records: Sequence[Mapping], tuning: Sequence[Mapping] = ()) -> str:
    """Markdown: CPU hours per family and size (summed over the finished runs' seeds: ``cpu_seconds``, the whole run,
    where recorded, else ``train_cpu_seconds``, the training alone, marked "train"), each family's total and the
    study's; then the study's wall time: the hours with a run in flight (``busy_hours``), from the first run's start
    to the last run's finish (idle gaps between sessions included) and the sum of the runs' own wall seconds (runs
    in parallel each counted). ``tuning``: the finished tuning trials behind the runs (``vitlab.studies.tuning``),
    whose CPU hours and wall time a last line adds to the study's."""
    ok = _ok(records)
    whole = all("cpu_seconds" in r["metrics"] for r in ok)
    key = "cpu_seconds" if whole else "train_cpu_seconds"
    sizes, grid = _grid(records, lambda m: float(m.get(key) or 0.0))
    lines = ["| family | " + " | ".join(f"{n:,}" for n in sizes) + " | all sizes |", "|---|" + "---|" * (len(sizes) + 1)]
    total = 0.0
    for fam, by in grid.items():
        hours = {n: sum(v) / 3600 for n, v in by.items()}
        total += sum(hours.values())
        lines.append(f"| {fam} | " + " | ".join(f"{hours[n]:.2f}" if n in hours else "" for n in sizes)
                     + f" | {sum(hours.values()):.2f} |")
    starts = [t for t in (_when(r.get("started")) for r in ok) if t]
    ends = [t for t in (_when(r.get("finished")) for r in ok) if t]
    span = (max(ends) - min(starts)).total_seconds() / 3600 if starts and ends else float("nan")
    runs = sum(float(r["metrics"].get("seconds") or 0.0) for r in ok) / 3600
    what = "CPU hours (whole runs)" if whole else "CPU hours of training (train: these records predate whole-run counts)"
    lines += ["", f"{what}: {total:.2f} in all over {len(ok)} finished runs. Wall time: {busy_hours(ok):.2f} h with a "
                  f"run in flight; {span:.2f} h from the first run's start to the last one's finish; {runs:.2f} h "
                  "summed over the runs' own wall clocks."]
    trials = _ok(tuning)
    if trials:
        tuned = _cpu_hours(trials, key)
        lines.append(f"Tuning: {tuned:.2f} CPU hours over {len(trials)} finished trials; with it the "
                     f"study took {total + tuned:.2f} CPU hours and {busy_hours([*ok, *trials]):.2f} h "
                     "of wall time with a run or trial in flight.")
    return "\n".join(lines)
