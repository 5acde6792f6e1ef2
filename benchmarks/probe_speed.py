"""Probing speed: the closed-form few-shot ridge probe against scikit-learn's LogisticRegression on the same
features (time and accuracy), and feature extraction (images/s) against a plain forward, in one process.

    python benchmarks/probe_speed.py [--train 5000] [--test 2000]

Model: the embedded default (ViT-Lite-7/4 on CIFAR-10). Data: CIFAR-10 when it is on this machine (its data folder
or ../shared; its features are what the probe is for), else the synthetic shapes.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch
from sklearn.linear_model import LogisticRegression
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler

import vitlab
from benchmarks._util import report
from vitlab.data.datasets import find_cifar, k_shot_indices, load_dataset, load_shapes, nested_subsets
from vitlab.probe.features import extract_features, preprocess_uint8
from vitlab.probe.linear import FewShotRidge, linear_probe_accuracy


def _data(n_train: int, n_test: int):
    if find_cifar("cifar10", "train") and find_cifar("cifar10", "test"):
        tr, te, name = load_dataset("cifar10", "train"), load_dataset("cifar10", "test"), "cifar10"
    else:
        tr, te, name = load_shapes("train"), load_shapes("test"), "shapes"
    tr = tr.subset(nested_subsets(tr.labels, [min(n_train, len(tr))])[0])
    te = te.subset(nested_subsets(te.labels, [min(n_test, len(te))])[0])
    return tr, te, name


@torch.no_grad()
def plain_forward(model, images: torch.Tensor, batch: int) -> None:
    tf = {"input_size": list(model.pretrained_cfg["input_size"][-2:]), "mean": model.pretrained_cfg["mean"],
          "std": model.pretrained_cfg["std"], "interpolation": "bicubic"}
    for i in range(0, len(images), batch):
        model(preprocess_uint8(images[i:i + batch], tf))


def run(n_train: int = 5000, n_test: int = 2000, shots: tuple[int, ...] = (1, 5, 10, 25), seeds: int = 3,
        batch: int = 256) -> dict:
    model = vitlab.load_model().eval()
    tr, te, name = _data(n_train, n_test)
    plain_forward(model, tr.images[:batch], batch)  # warm-up
    t_plain = time.perf_counter()
    plain_forward(model, tr.images, batch)
    t_plain = time.perf_counter() - t_plain
    t_feat = time.perf_counter()
    ftr = extract_features(model, tr, batch_size=batch, cache=False, progress=False)
    t_feat = time.perf_counter() - t_feat
    fte = extract_features(model, te, batch_size=batch, cache=False, progress=False)
    rows = []
    for k in shots:
        t_r, t_l, a_r, a_l = [], [], [], []
        for seed in range(seeds):
            idx = k_shot_indices(tr.labels, k, seed)
            t = time.perf_counter()
            a_r.append(FewShotRidge().fit(ftr[idx], tr.labels[idx]).score(fte, te.labels))
            t_r.append(time.perf_counter() - t)
            t = time.perf_counter()
            clf = make_pipeline(StandardScaler(), LogisticRegression(max_iter=1000))
            a_l.append(clf.fit(ftr[idx].numpy(), tr.labels[idx].numpy()).score(fte.numpy(), te.labels.numpy()))
            t_l.append(time.perf_counter() - t)
        rows.append({"shots": k, "ridge_s": statistics.median(t_r), "logistic_s": statistics.median(t_l),
                     "ridge_acc": statistics.mean(a_r), "logistic_acc": statistics.mean(a_l)})
    t = time.perf_counter()
    full_ridge = FewShotRidge().fit(ftr, tr.labels).score(fte, te.labels)
    t_full_ridge = time.perf_counter() - t
    t = time.perf_counter()
    full_log = linear_probe_accuracy(ftr, tr.labels, fte, te.labels)
    t_full_log = time.perf_counter() - t
    rows.append({"shots": "all", "ridge_s": t_full_ridge, "logistic_s": t_full_log, "ridge_acc": full_ridge,
                 "logistic_acc": full_log})
    return {"data": name, "train": len(tr), "test": len(te), "feature_dim": ftr.shape[1], "seeds": seeds,
            "threads": torch.get_num_threads(), "plain_images_per_s": len(tr) / t_plain,
            "features_images_per_s": len(tr) / t_feat, "rows": rows}


def format_table(res: dict) -> str:
    lines = [f"Feature extraction: {res['features_images_per_s']:.0f} images/s vs plain forward "
             f"{res['plain_images_per_s']:.0f} images/s: ratio **{res['features_images_per_s'] / res['plain_images_per_s']:.2f}** "
             f"({res['train']} {res['data']} images, {res['feature_dim']}-d features).", "",
             "| shots per class | ridge probe (s) | LogisticRegression (s) | logistic / ridge time | ridge accuracy | "
             "logistic accuracy |", "|---|---|---|---|---|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['shots']} | {r['ridge_s']:.4f} | {r['logistic_s']:.3f} | **{r['logistic_s'] / r['ridge_s']:.1f}** | "
                     f"{100 * r['ridge_acc']:.2f}% | {100 * r['logistic_acc']:.2f}% |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--train", type=int, default=5000)
    ap.add_argument("--test", type=int, default=2000)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    res = run(a.train, a.test)
    return report(res, format_table(res), a.json)


if __name__ == "__main__":
    raise SystemExit(main())
