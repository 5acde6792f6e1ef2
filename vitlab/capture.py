"""Exact attention capture for timm ViT-family models.

timm runs attention through fused ``scaled_dot_product_attention``: no softmax runs and nothing can be
hooked. ``capture_attention`` switches the fused path off *per module* (the global ``set_fused_attn`` has no
effect after a model is built), records the post-softmax maps that the module itself multiplies with its
values, and in ``finally`` puts back every flag and removes every hook, also when the body raises.

Two recording mechanisms, both reading the tensor the model really uses (never recomputing it):

* a forward hook on the module's ``attn_drop``: its output is the map that multiplies ``v``
  (in eval mode dropout is the identity, so this is exactly the post-softmax map);
* for attention modules without ``attn_drop`` (timm's ``AttentionPoolLatent``), a
  ``TorchFunctionMode`` active only while that module runs, which keeps the result of its softmax.

Shapes: one map per layer and forward call, ``(B, H, T, T)``; ``stack()`` gives ``(L, B, H, T, T)``
(rows = queries, columns = keys, T counting the prefix tokens). Reductions applied inside the hook
(``queries``, ``head_fusion``) shrink the Q or H axis while keeping the rank.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from typing import Literal

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

__all__ = [
    "AttentionCaptureError",
    "AttentionCapture",
    "capture_attention",
    "attention_maps",
    "find_attention_modules",
]

HeadFusion = Literal["mean", "max", "min"]
Queries = Literal["all", "prefix"] | int | Sequence[int] | slice | None


class AttentionCaptureError(RuntimeError):
    """The model's attention cannot be captured exactly; the message says why."""


def _is_attention(m: nn.Module) -> bool:
    has_drop = isinstance(getattr(m, "attn_drop", None), nn.Module)
    return (has_drop or hasattr(m, "fused_attn")) and hasattr(m, "num_heads")


def _attention_in(block: nn.Module) -> tuple[str, nn.Module] | None:
    attn = getattr(block, "attn", None)
    if isinstance(attn, nn.Module) and _is_attention(attn):
        return "attn", attn
    for name, m in block.named_modules():
        if name and _is_attention(m):
            return name, m
    return None


def find_attention_modules(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The self-attention module of each transformer block, in depth order, as ``(name, module)``."""
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)) and len(blocks):
        found = []
        for i, blk in enumerate(blocks):
            hit = _attention_in(blk)
            if hit is None:
                raise AttentionCaptureError(
                    f"block {i} ({type(blk).__name__}) of {type(model).__name__} has no attention module that "
                    "vitlab can capture (looked for a module with num_heads and attn_drop or fused_attn)"
                )
            found.append((f"blocks.{i}.{hit[0]}", hit[1]))
        return found
    found, inside = [], []
    for name, m in model.named_modules():
        if _is_attention(m) and "pool" not in name and not any(name.startswith(p + ".") for p in inside):
            found.append((name, m))
            inside.append(name)
    if not found:
        raise AttentionCaptureError(
            f"{type(model).__name__} has no self-attention layers that vitlab can capture: attention maps exist "
            "only for transformer models (timm ViT, DeiT, EVA, BEiT, ...), not for CNNs such as ResNets"
        )
    return found


def _find_pool(model: nn.Module) -> nn.Module | None:
    pool = getattr(model, "attn_pool", None)
    return pool if isinstance(pool, nn.Module) and hasattr(pool, "num_heads") else None


class _SoftmaxRecorder(TorchFunctionMode):
    """Keeps the outputs of softmax calls made while active."""

    _FUNCS = {torch.Tensor.softmax, torch.softmax, torch.nn.functional.softmax}

    def __init__(self) -> None:
        super().__init__()
        self.outputs: list[Tensor] = []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        if func in self._FUNCS and isinstance(out, Tensor) and out.dim() == 4:
            self.outputs.append(out)
        return out


class AttentionCapture:
    """What ``capture_attention`` records; read it with ``stack()``, ``pool_maps()`` and ``grads()``."""

    def __init__(self, layers: tuple[int, ...], names: tuple[str, ...], depth: int,
                 head_fusion: HeadFusion | None, queries: Queries, keep_grad: bool, num_prefix_tokens: int):
        self.layers = layers  # indices of the captured blocks
        self.names = names
        self.depth = depth
        self.head_fusion = head_fusion
        self.queries = queries
        self.keep_grad = keep_grad
        self.num_prefix_tokens = num_prefix_tokens
        self.maps: dict[int, list[Tensor]] = {i: [] for i in layers}  # per layer, one (B, H, Q, T) per call
        self.pool: list[Tensor] = []  # per call, (B, H, Lq, N)
        self._raw: dict[int, list[Tensor]] = {i: [] for i in layers}  # graph tensors when keep_grad

    # ------------------------------------------------------------------ recording
    def _reduce(self, attn: Tensor) -> Tensor:  # (B, H, T, T) -> (B, H', Q, T)
        q = self.queries
        if q is None or q == "all":
            pass
        elif q == "prefix":
            if self.num_prefix_tokens == 0:
                raise AttentionCaptureError("queries='prefix' but this model has no prefix (class) tokens")
            attn = attn[..., : self.num_prefix_tokens, :]
        elif isinstance(q, int):
            attn = attn[..., q : q + 1 if q != -1 else None, :]
        elif isinstance(q, slice):
            attn = attn[..., q, :]
        else:
            attn = attn[..., torch.as_tensor(list(q), device=attn.device), :]
        if self.head_fusion == "mean":
            attn = attn.mean(dim=1, keepdim=True)
        elif self.head_fusion == "max":
            attn = attn.amax(dim=1, keepdim=True)
        elif self.head_fusion == "min":
            attn = attn.amin(dim=1, keepdim=True)
        return attn

    def _record(self, layer: int, attn: Tensor) -> None:
        if attn.dim() != 4:
            raise AttentionCaptureError(
                f"layer {layer} produced an attention tensor of shape {tuple(attn.shape)}, expected (B, heads, "
                "queries, keys): this attention folds heads or windows into one axis (windowed attention?), and "
                "vitlab's (L, B, H, T, T) format needs global self-attention over all tokens"
            )
        if self.keep_grad:
            if attn.requires_grad:
                attn.retain_grad()
            self._raw[layer].append(attn)
            self.maps[layer].append(attn.detach().float())
        else:
            with torch.no_grad():
                self.maps[layer].append(self._reduce(attn.detach()).float())

    # ------------------------------------------------------------------ reading
    def _check(self) -> int:
        counts = {i: len(v) for i, v in self.maps.items()}
        n = max(counts.values(), default=0)
        if n == 0:
            raise AttentionCaptureError(
                "no attention maps were recorded: run the model inside the `with capture_attention(model)` block "
                "(if you did, its attention runs in a kernel vitlab could not switch off)"
            )
        missing = [i for i, c in counts.items() if c != n]
        if missing:
            raise AttentionCaptureError(
                f"captured {n} map(s) for some layers but {[counts[i] for i in missing]} for layers {missing}: "
                f"the number of captured maps differs from the depth ({len(self.layers)} layers selected of "
                f"{self.depth}); this model's blocks do not all run a capturable attention"
            )
        return n

    def stack(self) -> Tensor:
        """(L, B, H, Q, T) float32 over all recorded forward calls (batches concatenated)."""
        self._check()
        per_layer = [torch.cat(self.maps[i], dim=0) for i in self.layers]
        shapes = {tuple(t.shape[1:]) for t in per_layer}
        if len(shapes) != 1:
            detail = ", ".join(f"layer {i}: {tuple(t.shape)}" for i, t in zip(self.layers, per_layer))
            raise AttentionCaptureError(
                "layers attend over different token sets (windowed or pooled attention?), so their maps cannot "
                f"be stacked into (L, B, H, T, T): {detail}. Read capture.maps per layer instead"
            )
        batch = {t.shape[0] for t in per_layer}
        if len(batch) != 1:
            raise AttentionCaptureError(
                f"layers saw different batch sizes {sorted(batch)}: windowed attention folds windows into the "
                "batch; vitlab's (L, B, H, T, T) format needs global self-attention"
            )
        return torch.stack(per_layer)

    def grads(self) -> Tensor:
        """(L, B, H, T, T) gradients of the recorded maps (``keep_grad=True``, after ``backward()``)."""
        if not self.keep_grad:
            raise AttentionCaptureError("grads() needs capture_attention(..., keep_grad=True)")
        self._check()
        out = []
        for i in self.layers:
            gs = [t.grad for t in self._raw[i]]
            if any(g is None for g in gs):
                raise AttentionCaptureError(
                    f"layer {i} has no gradient: call .backward() on an output inside the capture block, "
                    "with gradients enabled"
                )
            out.append(torch.cat([g.float() for g in gs], dim=0))
        return torch.stack(out)

    def pool_maps(self) -> Tensor | None:
        """(B, H, Lq, N): the attention pool's own attention (latent queries over tokens), or None."""
        return torch.cat(self.pool, dim=0) if self.pool else None

    def clear(self) -> None:
        for v in (*self.maps.values(), *self._raw.values()):
            v.clear()
        self.pool.clear()


def _normalise_layers(layers: Sequence[int] | None, depth: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(depth))
    out = []
    for i in layers:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f"layer {i} is out of range for a model with {depth} blocks")
        out.append(j)
    return tuple(sorted(set(out)))


@contextlib.contextmanager
def capture_attention(
    model: nn.Module,
    *,
    layers: Sequence[int] | None = None,
    head_fusion: HeadFusion | None = None,
    queries: Queries = None,
    keep_grad: bool = False,
    pool: bool = True,
) -> Iterator[AttentionCapture]:
    """Record post-softmax attention while the caller runs ``model`` inside the block.

    ``layers`` keeps only those blocks (only they run unfused); ``head_fusion`` fuses heads inside the hook
    (H becomes 1); ``queries`` keeps only some query rows: ``"prefix"`` (the readout rows), an index, a
    list or a slice. ``keep_grad=True`` keeps the maps in the autograd graph so that after ``backward()``
    ``capture.grads()`` returns each layer's own gradient (no reductions then). The model runs in eval
    mode inside the block (never maps with dropout applied); its modes, fused flags and hooks are
    restored on exit, also when the body raises.
    """
    if head_fusion not in (None, "mean", "max", "min"):
        raise ValueError(f"head_fusion must be None, 'mean', 'max' or 'min', got {head_fusion!r}")
    if keep_grad and (head_fusion is not None or queries not in (None, "all")):
        raise ValueError("keep_grad=True records full maps; fuse heads or select queries after reading grads()")
    modules = find_attention_modules(model)
    depth = len(modules)
    chosen = _normalise_layers(layers, depth)
    n_prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    cap = AttentionCapture(chosen, tuple(modules[i][0] for i in chosen), depth, head_fusion, queries,
                           keep_grad, n_prefix)
    pool_module = _find_pool(model) if pool else None

    modes = [(m, m.training) for m in model.modules()]
    fused: list[tuple[nn.Module, bool]] = []
    handles: list[torch.utils.hooks.RemovableHandle] = []
    active_recorders: list[_SoftmaxRecorder] = []

    def softmax_hooks(module: nn.Module, on_maps) -> None:
        def pre(_m, _args):
            rec = _SoftmaxRecorder()
            rec.__enter__()
            active_recorders.append(rec)

        def post(_m, _args, _out):
            rec = active_recorders.pop()
            rec.__exit__(None, None, None)
            if rec.outputs:
                on_maps(rec.outputs[-1])

        handles.append(module.register_forward_pre_hook(pre))
        handles.append(module.register_forward_hook(post, always_call=True))

    try:
        model.eval()
        for i in chosen:
            m = modules[i][1]
            if hasattr(m, "fused_attn"):
                fused.append((m, m.fused_attn))
                m.fused_attn = False
            drop = getattr(m, "attn_drop", None)
            if isinstance(drop, nn.Module):
                handles.append(drop.register_forward_hook(lambda _m, _a, out, i=i: cap._record(i, out)))
            else:
                softmax_hooks(m, lambda a, i=i: cap._record(i, a))
        if pool_module is not None:
            if hasattr(pool_module, "fused_attn"):
                fused.append((pool_module, pool_module.fused_attn))
                pool_module.fused_attn = False
            softmax_hooks(pool_module, lambda a: cap.pool.append(a.detach().float()))
        yield cap
    finally:
        for h in handles:
            h.remove()
        while active_recorders:  # a forward raised between pre- and post-hook
            active_recorders.pop().__exit__(None, None, None)
        for m, flag in fused:
            m.fused_attn = flag
        for m, flag in modes:
            m.training = flag


def attention_maps(
    model: nn.Module,
    images: Tensor,
    *,
    batch_size: int | None = None,
    layers: Sequence[int] | None = None,
    head_fusion: HeadFusion | None = None,
    queries: Queries = None,
    progress: bool | None = None,
) -> Tensor:
    """Post-softmax attention of every block: ``(L, B, H, T, T)`` float32 (T counts the prefix tokens).

    ``images`` is a preprocessed ``(B, C, H, W)`` batch on the model's device; ``batch_size`` splits it
    into chunks (with a progress bar when there is more than one). Reductions as in ``capture_attention``.
    """
    from tqdm.auto import tqdm

    if images.dim() != 4:
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}")
    chunks = images.split(batch_size or len(images))
    show = len(chunks) > 1 if progress is None else progress
    with torch.no_grad(), capture_attention(model, layers=layers, head_fusion=head_fusion, queries=queries) as cap:
        for chunk in tqdm(chunks, desc="attention", disable=not show, leave=False):
            model(chunk)
        return cap.stack()
