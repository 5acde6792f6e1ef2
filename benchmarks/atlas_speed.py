"""Speed and memory of the analyses beyond the paper (issue 49): layer similarity (mini-batch CKA) and the causal
head atlas, each against a plain loop and plain forwards measured in the same process.

    python benchmarks/atlas_speed.py [--cka-images 64] [--head-images 4] [--memory-images 128] [--threads 1] [--json PATH]

* CKA: ``vitlab.layer_similarity`` of ``--cka-a`` against ``--cka-b`` (token sequences flattened, the default) against
  (a) the plain forwards of both models over the same images and (b) the loop most published mini-batch CKA code
  runs (one Gram matrix pair built per layer pair and batch, the HSIC formula written out), on the same features:
  ours builds each layer's centred Gram once per batch and takes all pairs in one matrix product; and (c) the plain
  full-batch loop (``cka_full_batch``: every image's features of every layer kept, then ``vitlab.cka`` per layer
  pair), end to end, with the largest difference between its matrix and ours (the two estimators agree in
  expectation, not to the digit).
* Head atlas: ``vitlab.head_importance`` (mean ablation) on ``--head-model`` with its runs starting at the ablated
  block (shared) against the same atlas from L x H full forwards (``share=False``) and against L x H plain forwards
  (one plain forward timed, times L x H: the cost the issue names). Plain forwards are the model's own (fused attention,
  no_grad), as the analyses run it.
* Peak memory, each in a fresh process: resident memory sampled every 2 ms above the warmed-up model (a lower bound)
  and the process's own peak resident memory (``resource.getrusage``: Python, torch, the model and the images
  included), for ``head_importance`` on ``--memory-model`` (last block's heads only: the peak is one batch's
  activations, the same for every block) and ``layer_similarity`` of that model with itself, over half of
  ``--memory-images`` and over all of them (default 128, the issue's ViT-B/16 at 224 px) in batches of
  ``--memory-batch``, against a plain forward of one batch: equal peaks at two image counts say that memory does not
  grow with the number of images. The plain full-batch CKA loop's peak over the same counts shows what the
  mini-batches save: its features of every image grow with their number.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm
import torch

import vitlab
from benchmarks._util import PeakRSS, machine_info, report
from vitlab.inspect.cka import MinibatchCKA, layer_features


def _timed(fn, *args, clock=time.perf_counter, **kwargs) -> tuple[float, object]:
    t = clock()
    out = fn(*args, **kwargs)
    return clock() - t, out


def _cpu(fn, *args, **kwargs) -> tuple[float, object]:
    """``_timed`` in this process's CPU seconds: with one torch thread, what the work costs, which the other
    processes of a shared machine do not inflate."""
    return _timed(fn, *args, clock=time.process_time, **kwargs)


@torch.no_grad()
def model_forward(model: torch.nn.Module, x: torch.Tensor, batch: int) -> None:
    """The model's own forward over ``x`` in batches (its fused attention kernel, as the analyses here run it: they
    capture no attention map), keeping nothing: the baseline of this benchmark."""
    for i in range(0, len(x), batch):
        model(x[i:i + batch])


def _model(name: str) -> torch.nn.Module:
    return timm.create_model(name, pretrained=False).eval()  # speed and memory do not depend on the weights


# ------------------------------------------------------------------------------------ loop reference
def _hsic1(k: torch.Tensor, l_: torch.Tensor) -> torch.Tensor:
    """The unbiased HSIC written out (Song et al. 2012), as published mini-batch CKA code computes it per pair."""
    n = len(k)
    k, l_ = k.clone(), l_.clone()
    k.fill_diagonal_(0)
    l_.fill_diagonal_(0)
    one = torch.ones(n, 1, dtype=k.dtype)
    return (torch.trace(k @ l_) + (one.T @ k @ one) * (one.T @ l_ @ one) / ((n - 1) * (n - 2))
            - 2 / (n - 2) * (one.T @ k @ l_ @ one)).squeeze() / (n * (n - 3))


def cka_loop(batches: list[tuple[list[torch.Tensor], list[torch.Tensor]]]) -> torch.Tensor:
    """(La, Lb) mini-batch CKA with a Python loop over layer pairs, the Grams of both layers built for every pair."""
    la, lb = len(batches[0][0]), len(batches[0][1])
    cross = torch.zeros(la, lb, dtype=torch.float64)
    sa, sb = torch.zeros(la, lb, dtype=torch.float64), torch.zeros(la, lb, dtype=torch.float64)
    for fa, fb in batches:
        for i in range(la):
            for j in range(lb):
                x, y = fa[i].double(), fb[j].double()
                k, l_ = x @ x.T, y @ y.T
                cross[i, j] += _hsic1(k, l_)
                sa[i, j] += _hsic1(k, k)
                sb[i, j] += _hsic1(l_, l_)
    return cross / (sa * sb).sqrt()


@torch.no_grad()
def cka_full_batch(model_a: torch.nn.Module, model_b: torch.nn.Module, x: torch.Tensor, batch: int) -> torch.Tensor:
    """(La, Lb) linear CKA the plain way: every image's features of every layer kept (forwards in batches of
    ``batch``, features joined), then the full-batch formula, ``vitlab.cka``, once per layer pair. A model compared
    with itself is run once."""
    def features(model: torch.nn.Module) -> list[torch.Tensor]:
        parts = [layer_features(model, c) for c in x.split(batch)]
        return [torch.cat(layer) for layer in zip(*parts)]

    fa = features(model_a)
    fb = fa if model_b is model_a else features(model_b)
    return torch.stack([torch.stack([vitlab.cka(a, b) for b in fb]) for a in fa])


# ------------------------------------------------------------------------------------ benchmark
def run_cka(name_a: str, name_b: str, images: int, batch: int, repeats: int) -> dict:
    a, b = _model(name_a), _model(name_b)
    x = torch.randn(images, 3, 224, 224)
    model_forward(a, x[:batch], batch)  # warm-up
    model_forward(b, x[:batch], batch)
    fwd, mine, full = [], [], []
    for _ in range(repeats):  # interleaved, the median of each: the load of a shared machine moves both alike
        fwd.append(_cpu(model_forward, a, x, batch)[0] + _cpu(model_forward, b, x, batch)[0])
        t, ours = _cpu(vitlab.layer_similarity, a, b, x, batch_size=batch, progress=False)
        mine.append(t)
        t, whole = _cpu(cka_full_batch, a, b, x, batch)
        full.append(t)
    t_fwd, t_ours, t_full = statistics.median(fwd), statistics.median(mine), statistics.median(full)
    with torch.no_grad():  # the same features for both analysis steps
        feats = [(layer_features(a, c), layer_features(b, c)) for c in x.split(batch)]
    acc = MinibatchCKA(len(feats[0][0]), len(feats[0][1]))
    t_step = time.process_time()
    for fa, fb in feats:
        acc.update(fa, fb)
    step = acc.result()
    t_step = time.process_time() - t_step
    t_loop, loop = _cpu(cka_loop, feats)
    torch.testing.assert_close(loop, step, rtol=1e-6, atol=1e-9)  # the same numbers
    torch.testing.assert_close(ours, step, rtol=1e-6, atol=1e-9)
    return {"a": name_a, "b": name_b, "images": images, "batch": batch, "layers": list(step.shape), "repeats": repeats,
            "clock": "process CPU seconds",
            "forward_s": t_fwd, "ours_s": t_ours, "ours/forward": t_ours / t_fwd,
            "full_batch_s": t_full, "full_batch/ours": t_full / t_ours,
            "full_batch_max_abs_diff": float((whole - ours).abs().max()),
            "ours_step_s": t_step, "loop_step_s": t_loop, "loop/ours step": t_loop / t_step}


def run_heads(name: str, images: int, batch: int, repeats: int) -> dict:
    model = _model(name)
    x, y = torch.randn(images, 3, 224, 224), torch.randint(0, 1000, (images,))
    depth, heads = len(model.blocks), model.blocks[0].attn.num_heads
    model_forward(model, x[:batch], batch)  # warm-up
    ones, sh, fu = [], [], []
    for _ in range(repeats):  # interleaved, the median of each
        ones.append(_timed(model_forward, model, x, batch)[0])
        t, shared = _timed(vitlab.head_importance, model, x, y, batch_size=batch, progress=False)
        sh.append(t)
        t, full = _timed(vitlab.head_importance, model, x, y, batch_size=batch, share=False, progress=False)
        fu.append(t)
    one, t_shared, t_full = statistics.median(ones), statistics.median(sh), statistics.median(fu)
    assert shared.shared and not full.shared
    torch.testing.assert_close(shared.per_image_drop, full.per_image_drop, rtol=1e-3, atol=1e-4)
    plain = one * depth * heads
    return {"model": name, "images": images, "batch": batch, "layers": depth, "heads": heads, "repeats": repeats,
            "plain_forward_s": one, "plain_lxh_s": plain, "shared_s": t_shared, "full_s": t_full,
            "plain_lxh/shared": plain / t_shared, "full/shared": t_full / t_shared}


def _peak_child(task: str, name: str, images: int, batch: int, threads: int, out) -> None:
    """In a fresh process: build ``name``, warm it up on 2 images, then run ``task`` over ``images`` images in batches
    of ``batch``; put (the sampled peak resident memory above the warmed-up level, the process's peak resident memory
    from ``getrusage``), in bytes, on ``out``."""
    import resource

    import scipy.stats  # noqa: F401  (the intervals' t quantile: code, not the analysis's data)
    import tqdm.auto  # noqa: F401

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = _model(name)
    x, y = torch.randn(images, 3, 224, 224), torch.randint(0, 1000, (images,))
    model_forward(model, x[:2], 2)
    with PeakRSS() as peak:
        if task == "forward":
            model_forward(model, x, batch)
        elif task == "cka_full":
            cka_full_batch(model, model, x, batch)
        elif task == "heads":  # the last block's heads: the peak is one batch's activations, the same for every block
            vitlab.head_importance(model, x, y, layers=[len(model.blocks) - 1], batch_size=batch, progress=False)
        else:
            vitlab.layer_similarity(model, model, x, batch_size=batch, progress=False)
    out.put((peak.extra, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024))  # Linux: KiB


def _peak(task: str, name: str, images: int, batch: int) -> tuple[float, float]:
    """MiB of peak resident memory above the warmed-up model that ``task`` needs, and the process's whole peak
    resident memory (MiB), measured in a fresh process (in this one, pages freed by earlier work would hide it)."""
    import multiprocessing as mp

    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    p = ctx.Process(target=_peak_child, args=(task, name, images, batch, torch.get_num_threads(), q))
    p.start()
    extra, whole = q.get()
    p.join()
    return extra / 2 ** 20, whole / 2 ** 20


def run_memory(name: str, images: int, batch: int, few: int | None = None) -> dict:
    """Peak memory of a plain forward of one batch, and of the head atlas and CKA over ``few`` (default
    ``images // 2``, at least two batches) and ``images`` images in batches of ``batch``: equal peaks say that memory
    does not grow with the number of images."""
    few = max(2 * batch, images // 2) if few is None else few
    fwd = _peak("forward", name, batch, batch)
    heads = [_peak("heads", name, n, batch) for n in (few, images)]
    cka = [_peak("cka", name, n, batch) for n in (few, images)]
    full = [_peak("cka_full", name, n, batch) for n in (few, images)]
    return {"model": name, "images": [few, images], "batch": batch,
            "forward_peak_mib": fwd[0], "heads_peak_mib": [h[0] for h in heads], "cka_peak_mib": [c[0] for c in cka],
            "cka_full_peak_mib": [f[0] for f in full],
            "forward_process_peak_mib": fwd[1], "heads_process_peak_mib": [h[1] for h in heads],
            "cka_process_peak_mib": [c[1] for c in cka], "cka_full_process_peak_mib": [f[1] for f in full]}


def run(cka_a: str = "vit_small_patch16_224", cka_b: str = "vit_tiny_patch16_224", cka_images: int = 64,
        head_model: str = "vit_small_patch16_224", head_images: int = 4, memory_model: str = "vit_base_patch16_224",
        memory_images: int = 128, memory_batch: int = 8, batch: int = 32, repeats: int = 3) -> dict:
    torch.manual_seed(0)
    return {"threads": torch.get_num_threads(),
            "cka": run_cka(cka_a, cka_b, cka_images, batch, repeats),
            "heads": run_heads(head_model, head_images, min(batch, head_images), repeats),
            "memory": run_memory(memory_model, memory_images, memory_batch)}


def format_table(res: dict) -> str:
    c, h, m = res["cka"], res["heads"], res["memory"]
    rows = [
        "| analysis | model(s) | images | ours (s) | baseline (s) | baseline / ours |",
        "|---|---|---|---|---|---|",
        f"| CKA vs plain forwards of both | {c['a']} x {c['b']} ({c['layers'][0]}x{c['layers'][1]}) | "
        f"{c['images']} | {c['ours_s']:.1f} | {c['forward_s']:.1f} | {c['forward_s'] / c['ours_s']:.2f} |",
    ]
    if "full_batch_s" in c:
        rows.append(f"| CKA vs plain full-batch loop | same | {c['images']} | {c['ours_s']:.1f} | "
                    f"{c['full_batch_s']:.1f} | **{c['full_batch/ours']:.2f}** |")
    rows += [
        f"| CKA, analysis step vs per-pair loop | same | {c['images']} | {c['ours_step_s']:.3f} | "
        f"{c['loop_step_s']:.2f} | **{c['loop/ours step']:.0f}** |",
        f"| head atlas vs L x H plain forwards | {h['model']} ({h['layers']}x{h['heads']}) | {h['images']} | "
        f"{h['shared_s']:.1f} | {h['plain_lxh_s']:.1f} | **{h['plain_lxh/shared']:.2f}** |",
        f"| head atlas vs its own L x H full forwards | same | {h['images']} | {h['shared_s']:.1f} | "
        f"{h['full_s']:.1f} | {h['full/shared']:.2f} |",
        "",
        f"Medians of {c['repeats']} interleaved rounds; L x H plain forwards: one forward's median x L x H."
        + (f" CKA: process CPU seconds, one torch thread, {c.get('machine', res.get('machine', {})).get('date', '')};"
           " head atlas: wall seconds." if c.get("clock") == "process CPU seconds" else ""),
        *memory_rows(m),
    ]
    return "\n".join(rows)


def memory_rows(m: dict) -> list[str]:
    """The table of the whole processes' peak resident memory (getrusage), for results that recorded it."""
    if "heads_process_peak_mib" not in m:
        return []
    (few, many), h, c = m["images"], m["heads_process_peak_mib"], m["cka_process_peak_mib"]
    rows = ["", f"| process peak memory, {m['model']}, 224 px, batches of {m['batch']} | {few} images "
            f"(MiB) | {many} images (MiB) |", "|---|---|---|",
            f"| plain forward of one batch | {m['forward_process_peak_mib']:.0f} | |",
            f"| head atlas (`head_importance`) | {h[0]:.0f} | {h[1]:.0f} |",
            f"| CKA with itself (`layer_similarity`) | {c[0]:.0f} | {c[1]:.0f} |"]
    if "cka_full_process_peak_mib" in m:
        f = m["cka_full_process_peak_mib"]
        rows.append(f"| CKA with itself, plain full-batch loop | {f[0]:.0f} | {f[1]:.0f} |")
    if "machine" in m:  # the memory part rerun alone (--memory-only): its own moment and load
        rows += ["", f"Memory measured alone, {m['machine']['date']}, load {m['machine']['load_average']}."]
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cka-a", default="vit_small_patch16_224")
    ap.add_argument("--cka-b", default="vit_tiny_patch16_224")
    ap.add_argument("--cka-images", type=int, default=64)
    ap.add_argument("--head-model", default="vit_small_patch16_224")
    ap.add_argument("--head-images", type=int, default=4)
    ap.add_argument("--memory-model", default="vit_base_patch16_224")
    ap.add_argument("--memory-images", type=int, default=128)
    ap.add_argument("--memory-batch", type=int, default=8)
    ap.add_argument("--memory-few", type=int, help="the smaller image count of the memory rows (default: half)")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=3, help="timed rounds, interleaved; the median of each")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (1: the shared 2-core machine's setting)")
    ap.add_argument("--json", type=Path)
    only = ap.add_mutually_exclusive_group()
    only.add_argument("--memory-only", action="store_true",
                      help="rerun the peak-memory part alone and replace it in --json's earlier result (which must "
                           "exist); the part records its own machine and date")
    only.add_argument("--cka-only", action="store_true",
                      help="rerun the CKA timing part alone and replace it in --json's earlier result (which must "
                           "exist); the part records its own machine and date")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    info = machine_info()
    if a.memory_only or a.cka_only:
        if a.json is None or not a.json.is_file():
            ap.error("--memory-only and --cka-only replace a part of an earlier result: give --json an existing file")
        import json

        res = json.loads(a.json.read_text())
        if a.memory_only:
            res["memory"] = {**run_memory(a.memory_model, a.memory_images, a.memory_batch, a.memory_few),
                             "machine": info}
        else:
            torch.manual_seed(0)
            res["cka"] = {**run_cka(a.cka_a, a.cka_b, a.cka_images, a.batch, a.repeats), "machine": info}
        return report(res, format_table(res), a.json)
    res = {"machine": info, **run(a.cka_a, a.cka_b, a.cka_images, a.head_model, a.head_images, a.memory_model,
                                  a.memory_images, a.memory_batch,
                                  a.batch, a.repeats)}
    return report(res, format_table(res), a.json)


if __name__ == "__main__":
    raise SystemExit(main())
