"""A causal head atlas: how much each attention head matters to the model's prediction of the true class.

For every head h of every block l, the head's output is *ablated* and the model is run again on the same images:

* ``ablation="mean"`` (mean ablation, the standard one): the head's slice of its attention's output, at the input of
  the output projection ``proj`` (columns h * d .. (h + 1) * d - 1 of the (B, N, H * d) tensor timm's attention
  builds from ``attn @ v``), is replaced by its mean over all the images, per token position: a (N, d) mean computed
  on the unablated model in a first pass over the images;
* ``ablation="zero"``: that slice is set to 0 (the head's output removed; the projection's bias stays).

Per image: the drop in the true class's log-probability (nats; ``log p(y)`` unablated minus ablated, positive when
the head helped) and in correctness (1 when the ablation makes a right prediction wrong, -1 for the reverse). Tables
are their means over the images, with a 95% interval over images (``vitlab.base.intervals.mean_interval``: Student t below
20 images, a percentile bootstrap from there on, none where every image gives the same value).

Sharing: the blocks before l are the same for every head of block l, so block l's input is computed once per batch
of images (walking the residual stream block by block) and each head's ablated run starts there (``run_from``);
L x H full forwards become about L x H / 2 block stacks. A model whose forward ``run_from`` does not follow
(``tail_matches`` fails: blocks with extra arguments, such as EVA's rotary embedding) runs full forwards instead;
``HeadImportance.shared`` says which ran. Memory holds one batch's activations and per-image drops, (L, H, B) numbers.
"""

from __future__ import annotations

import contextlib
import math
import operator
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
from torch import Tensor, nn

from vitlab.base.checks import check_count, check_seed, whole_index
from vitlab.base.intervals import N_BOOT, SEED, NoInterval, mean_interval, none_reason
from vitlab.base.modes import eval_mode, no_checkpointing
from vitlab.inspect.capture import AttentionCaptureError, check_images, find_attention_modules
from vitlab.inspect.residual import block_zero_input, run_from, tail_matches
from vitlab.models.info import AnyModel, resolve_model

__all__ = ["ABLATIONS", "Ablation", "HeadImportance", "head_importance", "head_slices", "ablate_head", "head_groups",
           "LOCAL", "GLOBAL"]

Ablation = Literal["mean", "zero"]
ABLATIONS = ("mean", "zero")


@dataclass(frozen=True)
class HeadImportance:
    """The head atlas of one ablation. Rows are the blocks ``layers`` (in that order), columns the heads; a layer with
    fewer heads than the widest has NaN in the columns it lacks.

    ``logprob_drop`` (L, H) float64: mean over images of the true class's log-probability unablated minus ablated
    (nats); ``logprob_interval`` (L, H, 2) its 95% interval (NaN where there is none). ``accuracy_drop`` (L, H)
    float64: accuracy unablated minus ablated (a fraction); ``accuracy_interval`` (L, H, 2). ``per_image_drop``
    (L, H, B) float32 and ``per_image_correct`` (L, H, B) bool (right after the ablation): the per-image values.
    ``base_logprob`` (B,) float64 and ``base_correct`` (B,) bool: the unablated model's. ``interval_method`` names
    the interval (e.g. "bootstrap over 128 images, 1000 resamples"); ``shared``: whether the runs started at the
    ablated block (True) or were full forwards (False)."""

    ablation: str
    layers: tuple[int, ...]
    logprob_drop: Tensor
    logprob_interval: Tensor
    accuracy_drop: Tensor
    accuracy_interval: Tensor
    per_image_drop: Tensor
    per_image_correct: Tensor
    base_logprob: Tensor
    base_correct: Tensor
    interval_method: str
    shared: bool

    def most_important(self) -> tuple[int, int]:
        """(row, head), 0-based, of the largest ``logprob_drop`` (the row indexes ``layers``); absent heads left
        out."""
        flat = int(torch.nan_to_num(self.logprob_drop, nan=-math.inf).argmax())
        row, head = divmod(flat, self.logprob_drop.shape[1])
        return row, head


#: ``head_groups``' codes of the lowest blocks' nearer and farther heads (0: a head above the lowest blocks)
LOCAL, GLOBAL = 1, 2


def head_groups(distance: Tensor, lowest: int) -> Tensor:
    """(L, H) mean attention distances -> (L, H) long codes: 0 for the heads above the ``lowest`` blocks; among the
    lowest blocks' heads ranked by distance (ties in index order), ``LOCAL`` for the nearer half (rounded down) and
    ``GLOBAL`` for the rest. Raises ValueError when ``lowest`` is not 1 to L."""
    if distance.dim() != 2:
        raise ValueError(f"distance must be (L, H) mean attention distances per head, got shape {tuple(distance.shape)}")
    if not whole_index(lowest) or not 1 <= lowest <= len(distance):
        raise ValueError(f"lowest must be a number of blocks from 1 to {len(distance)}, got {lowest!r}")
    codes = torch.zeros(distance.shape, dtype=torch.long)
    low = distance[:lowest].reshape(-1)
    order = torch.argsort(low, stable=True)
    flat = torch.full_like(low, GLOBAL, dtype=torch.long)
    flat[order[: len(low) // 2]] = LOCAL
    codes[:lowest] = flat.reshape(lowest, -1)
    return codes


def head_slices(model: AnyModel) -> list[list[tuple[nn.Module, int, int]]]:
    """Per block, per head (the branches of a parallel block in order): (the attention's output projection, the
    head's index in its module, the head's width d). Refuses an attention without a linear ``proj`` whose input is
    its heads' outputs side by side (``AttentionCaptureError``)."""
    out = []
    for layer in find_attention_modules(model):
        heads = []
        for name, m in zip(layer.names, layer.modules):
            proj, n = getattr(m, "proj", None), int(m.num_heads)
            if not isinstance(proj, nn.Linear) or proj.in_features % n:
                raise AttentionCaptureError(
                    f"{name} ({type(m).__name__}) has no linear output projection `proj` over its {n} heads' outputs "
                    "side by side: head ablation edits the input of that projection")
            heads += [(proj, h, proj.in_features // n) for h in range(n)]
        out.append(heads)
    return out


@contextlib.contextmanager
def ablate_head(proj: nn.Module, head: int, width: int, replacement: Tensor | None) -> Iterator[None]:
    """Inside the block, the input of ``proj`` (B, N, H * width) has columns ``head * width`` .. ``(head + 1) * width
    - 1`` replaced: by ``replacement`` (N, H * width) (its same columns, broadcast over the batch) or, for None, by 0.
    The hook is removed on exit, also when the body raises."""
    cols = slice(head * width, (head + 1) * width)

    def pre(_m: nn.Module, args: tuple) -> tuple:
        z = args[0].clone()
        if replacement is None:
            z[..., cols] = 0
        else:
            if replacement.shape[-2] != z.shape[-2]:
                raise AttentionCaptureError(f"the mean over images covers {replacement.shape[-2]} tokens but this "
                                            f"call has {z.shape[-2]}: images of one size only")
            z[..., cols] = replacement[..., cols].to(z.dtype)
        return (z, *args[1:])

    handle = proj.register_forward_pre_hook(pre)
    try:
        yield
    finally:
        handle.remove()


@contextlib.contextmanager
def _summing_inputs(projs: list[nn.Module]) -> Iterator[dict[int, Tensor]]:
    """Inside the block, the sum over the batch of each projection's (B, N, C) input, (N, C) float64, keyed by its
    position in ``projs``; hooks removed on exit."""
    sums: dict[int, Tensor] = {}
    handles = []

    def pre(k: int):
        def add(_m: nn.Module, args: tuple) -> None:
            s = args[0].detach().double().sum(0)
            sums[k] = s if k not in sums else sums[k] + s
        return add

    try:
        for k, p in enumerate(projs):
            handles.append(p.register_forward_pre_hook(pre(k)))
        yield sums
    finally:
        for h in handles:
            h.remove()


def _labels(labels: object, n: int) -> Tensor:
    if isinstance(labels, Tensor):
        y = labels
    else:
        try:
            y = torch.as_tensor(labels)
        except (TypeError, ValueError, RuntimeError) as e:
            raise TypeError(f"labels must be a (B,) tensor of class indices, got {type(labels).__name__}") from e
    if y.dim() != 1 or len(y) != n:
        raise ValueError(f"labels must be (B,) with one class index per image: {n} images, labels of shape "
                         f"{tuple(y.shape)}")
    if y.is_floating_point() or y.dtype == torch.bool or y.is_complex():
        raise TypeError(f"labels must be integer class indices, got {y.dtype}: pass labels.long()")
    return y.long()


def _layers(layers: Sequence[int] | None, depth: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(depth))
    if isinstance(layers, str) or not hasattr(layers, "__iter__"):
        raise TypeError(f"layers must be a list of block indices or None, got {layers!r}")
    out = []
    for i in layers:
        if not whole_index(i) or not -depth <= operator.index(i) < depth:
            raise ValueError(f"layer {i!r} is no block index of a model with {depth} blocks (0 to {depth - 1})")
        out.append(operator.index(i) % depth)
    if not out:
        raise ValueError("layers is empty: give at least one block index, or None for every block")
    return tuple(sorted(set(out)))


def _true_logprob(logits: Tensor, y: Tensor) -> tuple[Tensor, Tensor]:
    """(B, K) logits -> ((B,) float64 log-probability of ``y``, (B,) bool argmax == y)."""
    lp = logits.double().log_softmax(-1)
    return lp.gather(1, y[:, None]).squeeze(1).cpu(), (logits.argmax(-1) == y).cpu()


def _unablated(model: nn.Module, chunks: list[tuple[Tensor, Tensor]], projs: list[nn.Module]
               ) -> tuple[Tensor, Tensor, Tensor, dict[nn.Module, Tensor]]:
    """Pass 1 of ``head_importance`` over the (images, labels) ``chunks``: the unablated model's (B,) log-probability
    of the true class and (B,) correctness, the first chunk's logits, and each of ``projs``' mean (N, C) input over
    the images (the mean ablation's replacement; {} for no ``projs``). Refuses labels outside the model's classes."""
    base_lp, base_ok, first = [], [], None
    with _summing_inputs(projs) as sums:
        for x, t in chunks:
            logits = model(x)
            classes = logits.shape[-1]
            if int(t.min()) < 0 or int(t.max()) >= classes:
                raise ValueError(f"labels must be class indices 0 to {classes - 1} for this model's {classes} "
                                 f"outputs, got values from {int(t.min())} to {int(t.max())}")
            lp, ok = _true_logprob(logits, t)
            base_lp.append(lp)
            base_ok.append(ok)
            first = logits if first is None else first
    n = sum(len(x) for x, _ in chunks)
    return torch.cat(base_lp), torch.cat(base_ok), first, {p: sums[k] / n for k, p in enumerate(projs)}


@torch.no_grad()
def head_importance(model: AnyModel, images: Tensor, labels: Tensor, *, ablation: Ablation = "mean",
                    layers: Sequence[int] | None = None, batch_size: int = 32, share: bool | None = None,
                    n_boot: int = N_BOOT, seed: int = SEED, progress: bool | None = None,
                    on_progress: Callable[[int, int], None] | None = None) -> HeadImportance:
    """The (L, H) head atlas of ``model`` on ``images`` (a preprocessed (B, C, H, W) batch) with true ``labels``
    ((B,) class indices): see the module and ``HeadImportance``. ``ablation``: "mean" or "zero"; ``layers``: the
    blocks to measure (default all); ``batch_size``: images per forward; ``share``: True starts each ablated run at
    its block (refused for a model ``run_from`` does not follow), False runs full forwards, None picks True where the
    model passes ``tail_matches``. ``n_boot``, ``seed``: the bootstrap's. ``on_progress``: called with (ablated runs
    done, runs in all) after each run (e.g. a widget's progress bar; ``progress`` draws tqdm's). The model comes back
    unchanged (modes, hooks), also when a forward raises."""
    from tqdm.auto import tqdm

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    check_count("batch_size", batch_size)
    check_count("n_boot", n_boot)
    seed = check_seed("seed", seed)
    if ablation not in ABLATIONS:
        raise ValueError(f"ablation must be one of {ABLATIONS}, got {ablation!r}")
    if share not in (None, True, False):
        raise ValueError(f"share must be True, False or None, got {share!r}")
    y = _labels(labels, len(images)).to(images.device)
    slices = head_slices(rm)
    rows = _layers(layers, len(slices))
    width = max(len(slices[i]) for i in rows)
    chunks = list(zip(images.split(batch_size), y.split(batch_size)))

    with eval_mode(model), no_checkpointing(model):
        projs = list(dict.fromkeys(p for i in rows for p, _, _ in slices[i]))
        base_lp_all, base_ok_all, first, means = _unablated(model, chunks, projs if ablation == "mean" else [])
        matches = tail_matches(rm, chunks[0][0], first)
        if share and not matches:
            raise ValueError(f"share=True: running {type(model).__name__} from a block's input does not give its own "
                             "logits (its blocks take more than the tokens, or its forward adds steps): pass "
                             "share=False or None")
        shared = matches if share is None else share

        drop = torch.full((len(rows), width, len(images)), float("nan"))
        right = torch.zeros((len(rows), width, len(images)), dtype=torch.bool)
        show = progress if progress is not None else len(chunks) * len(rows) > 1
        done, total = 0, len(chunks) * sum(len(slices[i]) for i in rows)
        bar = tqdm(total=total, desc="head ablations", disable=not show, leave=False)
        start = 0
        for x, t in chunks:
            end = start + len(x)
            h_in, at = (block_zero_input(rm, x), 0) if shared else (None, 0)
            for r, layer in enumerate(rows):
                if shared:
                    h_in, at = run_from(rm, at, h_in, stop=layer), layer  # block `layer`'s input, once
                for g, (proj, head, d) in enumerate(slices[layer]):
                    with ablate_head(proj, head, d, means.get(proj)):
                        logits = run_from(rm, layer, h_in) if shared else model(x)
                    lp, ok = _true_logprob(logits, t)
                    drop[r, g, start:end] = (base_lp_all[start:end] - lp).float()
                    right[r, g, start:end] = ok
                    bar.update(1)
                    done += 1
                    if on_progress is not None:
                        on_progress(done, total)
            start = end
        bar.close()

    acc_drop = base_ok_all.double()[None, None] - right.double()
    acc_drop = torch.where(drop.isnan(), torch.full_like(acc_drop, float("nan")), acc_drop)
    lp_iv, method = _intervals(drop.double(), n_boot, seed)
    acc_iv, _ = _intervals(acc_drop, n_boot, seed)
    return HeadImportance(ablation=ablation, layers=rows, logprob_drop=drop.double().mean(-1), logprob_interval=lp_iv,
                          accuracy_drop=acc_drop.mean(-1), accuracy_interval=acc_iv, per_image_drop=drop,
                          per_image_correct=right, base_logprob=base_lp_all, base_correct=base_ok_all,
                          interval_method=method, shared=bool(shared))


def _intervals(values: Tensor, n_boot: int, seed: int) -> tuple[Tensor, str]:
    """(L, H, B) per-image values -> (L, H, 2) 95% intervals of their means (NaN where none, and for absent heads),
    and the method of the cells that have one."""
    out = torch.full((*values.shape[:2], 2), float("nan"), dtype=torch.float64)
    method = ""
    arr = values.numpy()
    for i in range(arr.shape[0]):
        for j in range(arr.shape[1]):
            v = arr[i, j]
            if np.isnan(v).any():
                continue
            iv, how = mean_interval(v, n_boot, seed, "images")
            out[i, j] = torch.tensor(iv, dtype=torch.float64)
            if none_reason(how) is None:
                method = how
    return out, method or NoInterval(f"no head's per-image values over {values.shape[-1]} images have a spread")
