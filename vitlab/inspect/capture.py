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
(``queries``, ``head_fusion``) shrink the Q or H axis while keeping the rank. A class token that joins late (ConViT:
before block ``local_up_to_layer``, ``ModelInfo.class_token_joins``) does not exist in the earlier blocks, which
attend over the N patches alone: their (B, H, N, N) maps are recorded as (B, H, 1 + N, 1 + N) with the class token's
row and column those of the identity (it attends only to itself and nothing attends to it; its gradients there are 0),
so every layer stacks over the same T tokens and rollout carries the class token through those blocks unchanged.

Also here, as every analysis that runs a model on images starts with them: ``check_images`` (a float (B, C, H, W)
batch; with a model, its channels, size, device and dtype: ``check_input_channels``, ``check_input_size``,
``check_input_device``, ``check_input_dtype``). The checks of plain counts and indices are ``vitlab.base.checks``'.
"""

from __future__ import annotations

import contextlib
import operator
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode

from vitlab.base.checks import check_count, whole_index
from vitlab.base.modes import eval_mode, no_checkpointing
from vitlab.models.info import AnyModel, class_token_join, class_token_never_joins, resolve_model

__all__ = [
    "HEAD_FUSIONS",
    "Reduction",
    "fuse_heads",
    "AttentionCaptureError",
    "AttentionCapture",
    "capture_attention",
    "attention_maps",
    "check_images",
    "check_input_channels",
    "check_input_device",
    "check_input_dtype",
    "check_input_size",
    "find_attention_modules",
    "AttentionLayer",
]

HeadFusion = Literal["mean", "max", "min"]
Queries = Literal["all", "prefix"] | int | Sequence[int] | slice | None


class AttentionCaptureError(RuntimeError):
    """The model's attention cannot be captured exactly; the message says why."""


def _is_attention(m: nn.Module) -> bool:
    has_drop = isinstance(getattr(m, "attn_drop", None), nn.Module)
    return (has_drop or hasattr(m, "fused_attn")) and hasattr(m, "num_heads")


def _unsupported(m: nn.Module) -> str | None:
    """Why an attention module's softmax is not the map it applies to its values, or None."""
    if hasattr(m, "_compute_lambda") or "Diff" in type(m).__name__:
        return ("differential attention: the map applied to the values is the difference of two softmax maps "
                "(rows do not sum to 1), not a post-softmax attention")
    if hasattr(m, "proj_l") and hasattr(m, "proj_w"):
        return "talking-heads attention: heads are mixed after the softmax, so no per-head post-softmax map exists"
    if type(m).__name__ == "XCA":
        return ("cross-covariance attention (XCiT): its softmax runs over feature channels, not tokens, so it is no "
                "token-to-token map")
    return None


@dataclass(frozen=True)
class AttentionLayer:
    """The attention of one transformer block: usually one module; parallel branches have their heads joined."""

    index: int
    names: tuple[str, ...]
    modules: tuple[nn.Module, ...]


def _attention_in(block: nn.Module) -> list[tuple[str, nn.Module]]:
    """Outermost attention modules of a block (the block itself when it is one, e.g. parallel-scaling blocks)."""
    if _is_attention(block):
        return [("", block)]
    found: list[tuple[str, nn.Module]] = []
    for name, m in block.named_modules():
        if name and _is_attention(m) and not any(name.startswith(p + ".") for p, _ in found):
            found.append((name, m))
    return found


def _layer(index: int, prefix: str, hits: list[tuple[str, nn.Module]]) -> AttentionLayer:
    for name, m in hits:
        why = _unsupported(m)
        if why:
            raise AttentionCaptureError(f"{prefix}{'.' + name if name else ''} ({type(m).__name__}) uses {why}; "
                                        "vitlab reports only exact post-softmax maps")
    names = tuple(f"{prefix}.{n}" if n else prefix for n, _ in hits)
    return AttentionLayer(index, names, tuple(m for _, m in hits))


def find_attention_modules(model: AnyModel) -> list[AttentionLayer]:
    """The self-attention of each transformer block, in depth order.

    A block with several attention modules in parallel (timm's ``ParallelThingsBlock``) is one layer whose
    heads are the branches' heads, concatenated in branch order. Attentions whose applied map is not a
    post-softmax map (differential, talking-heads) and CaiT's class attention raise ``AttentionCaptureError``.
    """
    model = resolve_model(model).module
    blocks = getattr(model, "blocks", None)
    if isinstance(getattr(model, "blocks_token_only", None), (nn.Sequential, nn.ModuleList)):
        raise AttentionCaptureError(
            f"{type(model).__name__} (CaiT) attends over its patches alone in its blocks and lets its class token join "
            "only in class-attention blocks (blocks_token_only), where the class token alone attends (a 1 x (1 + N) "
            "map, the patches left as they are): its attention is no (L, B, H, T, T) stack over the same tokens, so "
            "vitlab refuses it rather than drop the readout's own layers. Use the maps that need no attention: "
            "vitlab.integrated_gradients or vitlab.occlusion")
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)) and len(blocks):
        layers = []
        for i, blk in enumerate(blocks):
            hits = _attention_in(blk)
            if not hits:
                raise AttentionCaptureError(
                    f"block {i} ({type(blk).__name__}) of {type(model).__name__} has no attention module that "
                    "vitlab can capture (looked for a module with num_heads and attn_drop or fused_attn)"
                )
            layers.append(_layer(i, f"blocks.{i}", hits))
        return layers
    found: list[tuple[str, nn.Module]] = []
    for name, m in model.named_modules():
        if _is_attention(m) and "pool" not in name and not any(name.startswith(p + ".") for p, _ in found):
            found.append((name, m))
    if not found:
        raise AttentionCaptureError(
            f"{type(model).__name__} has no self-attention layers that vitlab can capture: attention maps exist "
            "only for transformer models (timm ViT, DeiT, EVA, BEiT, ...), not for CNNs such as ResNets"
        )
    return [_layer(i, name, [("", m)]) for i, (name, m) in enumerate(found)]


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


#: A per-layer reduction applied inside the hook: ``reduce(layer_index, maps)`` with ``maps`` (B, H', Q, T) after any
#: head fusion and query selection; it returns what to keep for that call, or None to keep nothing (a reduction
#: that accumulates its own state). Peak memory then no longer grows with depth.
Reduction = Callable[[int, Tensor], "Tensor | None"]


class _PerCallStore:
    """Keeps one tensor per layer and forward call; ``stack`` concatenates the calls."""

    def __init__(self, layers: tuple[int, ...]) -> None:
        self.layers = layers
        self.items: dict[int, list[Tensor]] = {i: [] for i in layers}

    def add(self, layer: int, t: Tensor, hint: str) -> None:
        self.items[layer].append(t.float())

    def counts(self) -> dict[int, int]:
        return {i: len(v) for i, v in self.items.items()}

    def stack(self, hint: str) -> Tensor:
        per_layer = [v[0] if len(v) == 1 else torch.cat(v, dim=0) for v in (self.items[i] for i in self.layers)]
        if len({tuple(t.shape[1:]) for t in per_layer}) != 1 or len({t.shape[0] for t in per_layer}) != 1:
            detail = ", ".join(f"layer {i}: {tuple(t.shape)}" for i, t in zip(self.layers, per_layer))
            raise AttentionCaptureError(
                "layers attend over different token sets or fold windows into the batch (windowed attention), so "
                f"their maps cannot be stacked into (L, B, H, T, T): {detail}. {hint}"
            )
        return torch.stack(per_layer)

    def clear(self) -> None:
        for v in self.items.values():
            v.clear()


class _PreallocatedStore:
    """Writes every layer's maps straight into one (L, total, ...) float32 tensor: one copy, no concatenation,
    for callers that know the number of images in advance (``attention_maps``)."""

    def __init__(self, layers: tuple[int, ...], total: int) -> None:
        self.layers, self.total = layers, total
        self.slot = {i: k for k, i in enumerate(layers)}
        self.out: Tensor | None = None
        self.filled = {i: 0 for i in layers}

    def add(self, layer: int, t: Tensor, hint: str) -> None:
        if self.out is None:
            self.out = torch.empty(len(self.layers), self.total, *t.shape[1:], dtype=torch.float32, device=t.device)
        start, out = self.filled[layer], self.out[self.slot[layer]]
        if t.shape[1:] != out.shape[1:]:
            raise AttentionCaptureError(
                f"layer {layer} produced maps of shape {tuple(t.shape)} while earlier layers gave "
                f"{tuple(out.shape[1:])} per image: layers attend over different token sets or fold windows into "
                f"the batch (windowed attention?). {hint}"
            )
        if len(t) > self.total:  # one call alone: too many images, or windows folded into the batch
            raise AttentionCaptureError(
                f"layer {layer} produced {len(t)} maps in one call, more than preallocate={self.total}: either more "
                "images ran than preallocate says (pass the number the block runs, or leave it unset), or the layer "
                f"folds attention windows into the batch (windowed attention). {hint}")
        if start + len(t) > self.total:
            raise AttentionCaptureError(
                f"more images ran inside the capture than preallocate={self.total} (layer {layer} reached "
                f"{start + len(t)}): pass the total number of images the block will run, or leave preallocate unset")
        out[start : start + len(t)].copy_(t)
        self.filled[layer] = start + len(t)

    def counts(self) -> dict[int, int]:
        return {i: 1 if f else 0 for i, f in self.filled.items()}  # stack() refuses a partly filled tensor

    def stack(self, hint: str) -> Tensor:
        short = {i: f for i, f in self.filled.items() if 0 < f < self.total}
        if short:
            ran = max(short.values())
            raise AttentionCaptureError(f"{ran} of preallocate={self.total} images ran inside the capture, so the "
                                        "rest of the preallocated maps hold no attention: pass the number of images "
                                        "the block runs as preallocate, or leave it unset")
        return self.out

    def clear(self) -> None:
        self.out = None
        self.filled = {i: 0 for i in self.layers}


class AttentionCapture:
    """What ``capture_attention`` records; read it with ``stack()``, ``pool_maps()``, ``grads()`` and
    ``graph_maps()``."""

    def __init__(self, layers: tuple[AttentionLayer, ...], depth: int, head_fusion: HeadFusion | None,
                 queries: Queries, keep_grad: bool, num_prefix_tokens: int, preallocate: int | None = None,
                 reduce: Reduction | None = None, class_token_joins: int = 0):
        self.layers = tuple(la.index for la in layers)  # indices of the captured blocks
        self.names = tuple(n for la in layers for n in la.names)
        self.depth = depth
        self.head_fusion = head_fusion
        self.queries = queries
        self.keep_grad = keep_grad
        self.num_prefix_tokens = num_prefix_tokens
        self.reduce = reduce
        self.class_token_joins = class_token_joins  # blocks before it attend over the patches alone
        self._branches = {la.index: len(la.modules) for la in layers}
        self.pool: list[Tensor] = []  # per call, (B, H, Lq, N)
        self._graph: dict[int, list[list[Tensor]]] = {i: [] for i in self.layers}  # graph tensors per call, branch
        self._pending: dict[int, dict[int, Tensor]] = {i: {} for i in self.layers}
        self._calls = {i: 0 for i in self.layers}
        self._store = _PreallocatedStore(self.layers, preallocate) if preallocate else _PerCallStore(self.layers)
        self.global_layers: tuple[int, ...] = ()

    @property
    def maps(self) -> dict[int, list[Tensor]]:
        """Per layer, the recorded tensors of each forward call (the per-call store only)."""
        if not isinstance(self._store, _PerCallStore):
            raise AttentionCaptureError("this capture writes into one preallocated tensor: read it with stack()")
        return self._store.items

    # ------------------------------------------------------------------ recording
    def _select(self, attn: Tensor) -> Tensor:  # (B, H, T, T) -> (B, H', Q, T): query rows, head fusion
        q = self.queries
        everything = q is None or (isinstance(q, str) and q == "all")  # never q == "all" on an array
        if everything:
            pass
        elif isinstance(q, str) and q == "prefix":
            if self.num_prefix_tokens == 0:
                raise AttentionCaptureError("queries='prefix' but this model has no prefix (class) tokens")
            attn = attn[..., : self.num_prefix_tokens, :]
        elif isinstance(q, slice):
            attn = attn[..., q, :]
        else:
            T = attn.shape[-2]
            if hasattr(q, "tolist") and getattr(q, "ndim", 0) >= 1:  # a torch tensor or numpy array of indices
                q = q.tolist()
            rows = list(q) if isinstance(q, Iterable) and not hasattr(q, "__index__") else [q]  # 1.0: one, refused
            if not all(whole_index(r) for r in rows):  # numpy and torch integers too; True is no row 1
                raise AttentionCaptureError(f"queries={q!r}: give 'all', 'prefix', a query index, a list of them or a "
                                            "slice")
            rows = [operator.index(r) for r in rows]
            bad = [r for r in rows if not -T <= r < T]
            if bad:
                raise AttentionCaptureError(f"queries {bad} are out of range for {T} tokens (-{T} to {T - 1})")
            attn = attn[..., torch.as_tensor(rows, device=attn.device), :]
        if not everything:
            attn = attn.clone()  # the selected rows alone: a view would keep every row's storage alive
        if self.head_fusion is not None:
            attn = fuse_heads(attn, self.head_fusion, dim=1, keepdim=True)
        return attn

    def _record(self, layer: int, branch: int, attn: Tensor, num_heads: int) -> None:
        if attn.dim() == 3 and attn.shape[0] % num_heads == 0:  # heads folded into the batch (SAM): (B*H, N, N)
            attn = attn.view(-1, num_heads, *attn.shape[-2:])
        if attn.dim() != 4:
            raise AttentionCaptureError(
                f"layer {layer} produced an attention tensor of shape {tuple(attn.shape)}, expected (B, heads, "
                "queries, keys): this attention folds heads or windows into one axis (windowed attention?), and "
                "vitlab's (L, B, H, T, T) format needs global self-attention over all tokens"
            )
        n = self._branches[layer]
        if self.keep_grad and attn.requires_grad:
            attn.retain_grad()
        if n > 1:
            self._pending[layer][branch] = attn
            if len(self._pending[layer]) < n:
                return
            parts = [self._pending[layer].pop(b) for b in range(n)]
        else:
            parts = [attn]
        if self.keep_grad:
            self._graph[layer].append(parts)
        self._calls[layer] += 1
        with torch.no_grad():
            full = parts[0] if n == 1 else torch.cat(parts, dim=1)  # (B, H_total, T, T)
            if layer < self.class_token_joins:
                full = _with_class_token(full, 1.0)
            kept = full.detach() if self.keep_grad else self._select(full.detach())
            if self.reduce is not None:
                kept = self.reduce(layer, kept)
            if kept is not None:
                self._store.add(layer, kept, self.global_hint())

    def global_hint(self) -> str:
        if self.global_layers:
            return (f"Layers with global attention: {list(self.global_layers)}; capture them alone with "
                    f"layers={list(self.global_layers)}")
        return ("vitlab's (L, B, H, T, T) format needs global self-attention: capture layers of one kind with "
                "layers=[...], or read capture.maps per layer")

    # ------------------------------------------------------------------ reading
    def _check(self, counts: dict[int, int] | None = None) -> int:
        counts = self._calls if counts is None else counts
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
        """(L, B, H, Q, T) float32 over all recorded forward calls (batches concatenated); with a ``reduce``, the
        stacked outputs of the reduction, (L, B, ...)."""
        self._check()
        if self.reduce is not None and not any(self._store.counts().values()):
            raise AttentionCaptureError("this capture's reduction kept nothing (it returned None): read the state "
                                        "the reduction accumulated instead")
        self._check(self._store.counts())
        return self._store.stack(self.global_hint())

    def graph_maps(self, call: int = 0) -> list[tuple[Tensor, ...]]:
        """Per captured layer, the maps of forward call ``call`` exactly as the model computed them, one (B, H, T, T)
        tensor per attention branch (usually one), still in the autograd graph (``keep_grad=True``): the tensors
        ``grads()`` reads the gradients of, and what ``torch.autograd.grad`` can differentiate against. A ConViT's
        blocks before its class token joins give their (B, H, N, N) maps over the patches alone, without the class
        token's row and column that ``stack()`` and ``grads()`` add."""
        if not self.keep_grad:
            raise AttentionCaptureError("graph_maps() needs capture_attention(..., keep_grad=True)")
        self._check()
        return [tuple(self._graph[i][call]) for i in self.layers]

    def grads(self) -> Tensor:
        """(L, B, H, T, T) gradients of the recorded maps (``keep_grad=True``, after ``backward()``)."""
        if not self.keep_grad:
            raise AttentionCaptureError("grads() needs capture_attention(..., keep_grad=True)")
        self._check()
        out = []
        for i in self.layers:
            calls = []
            for parts in self._graph[i]:
                if any(p.grad is None for p in parts):
                    raise AttentionCaptureError(
                        f"layer {i} has no gradient: call .backward() on an output inside the capture block, "
                        "with gradients enabled"
                    )
                g = torch.cat([p.grad.float() for p in parts], dim=1)
                calls.append(_with_class_token(g, 0.0) if i < self.class_token_joins else g)
            out.append(torch.cat(calls, dim=0))
        return torch.stack(out)

    def pool_maps(self) -> Tensor | None:
        """(B, H, Lq, N): the attention pool's own attention (latent queries over tokens), or None."""
        return torch.cat(self.pool, dim=0) if self.pool else None

    def clear(self) -> None:
        for v in self._graph.values():
            v.clear()
        self._store.clear()
        self.pool.clear()
        self._calls = {i: 0 for i in self.layers}


def _with_class_token(maps: Tensor, diagonal: float) -> Tensor:
    """(B, H, N, N) maps of a block the class token has not joined yet -> (B, H, 1 + N, 1 + N): the class token's row
    and column zero but for ``diagonal`` at (0, 0) (1.0 for attention: the identity; 0.0 for gradients)."""
    B, H, Q, K = maps.shape
    out = maps.new_zeros(B, H, Q + 1, K + 1)
    out[..., 1:, 1:] = maps
    out[..., 0, 0] = diagonal
    return out


def _normalise_layers(layers: Sequence[int] | None, depth: int) -> tuple[int, ...]:
    if layers is None:
        return tuple(range(depth))
    if isinstance(layers, str) or not isinstance(layers, Iterable) or getattr(layers, "ndim", 1) == 0:
        one = whole_index(layers)
        raise TypeError(f"layers must be a list of block indices or None, got {layers!r}"
                        + (f": pass [{layers}] for that one block" if one else ""))
    layers = layers.tolist() if hasattr(layers, "tolist") else list(layers)  # a torch or NumPy array of indices too
    bad = [i for i in layers if not whole_index(i)]
    if bad:
        raise TypeError(f"layers must be whole block indices, got {bad} in {list(layers)}")
    layers = [operator.index(i) for i in layers]
    if len(layers) == 0:
        raise ValueError(f"layers is empty: give at least one block index (0 to {depth - 1}, or negative from the "
                         "end), or layers=None for every block")
    out = []
    for i in layers:
        j = i + depth if i < 0 else i
        if not 0 <= j < depth:
            raise ValueError(f"layer {i} is out of range for a model with {depth} blocks")
        out.append(j)
    return tuple(sorted(set(out)))


@contextlib.contextmanager
def capture_attention(
    model: AnyModel,
    *,
    layers: Sequence[int] | None = None,
    head_fusion: HeadFusion | None = None,
    queries: Queries = None,
    keep_grad: bool = False,
    pool: bool = True,
    reduce: Reduction | None = None,
    preallocate: int | None = None,
) -> Iterator[AttentionCapture]:
    """Record post-softmax attention while the caller runs ``model`` inside the block.

    ``layers`` keeps only those blocks (only they run unfused); ``head_fusion`` fuses heads inside the hook
    (H becomes 1); ``queries`` keeps only some query rows: ``"prefix"`` (the prefix tokens' rows: class,
    distillation and register tokens, whatever the readout), an index, a list or a slice. ``reduce(layer, maps)`` reduces each layer's maps inside the hook (see ``Reduction``), so only
    its output is kept. ``preallocate=N`` (the number of images the block will run) writes the maps into one
    preallocated (L, N, ...) tensor instead of concatenating per-call tensors at the end. ``keep_grad=True`` keeps
    the maps in the autograd graph so that after ``backward()`` ``capture.grads()`` returns each layer's own
    gradient (no reductions then). The model runs in eval
    mode and without gradient checkpointing inside the block (never maps with dropout applied); its modes, fused and
    checkpointing flags and hooks are restored on exit, also when the body raises. A wrapped model
    (``torch.compile``, ``nn.DataParallel``) is captured through the module it wraps: run that module, or the
    wrapper on one device, inside the block (DataParallel over several GPUs calls the hooks from several threads, in
    no fixed order of images). A ConViT's blocks before its class token joins (``ModelInfo.class_token_joins``) are
    recorded with the class token's identity row and column around their patch-by-patch maps (see the module's
    docstring), so that every layer has the same T.
    """
    rm = resolve_model(model)
    model = rm.module
    if head_fusion not in (None, "mean", "max", "min"):
        raise ValueError(f"head_fusion must be None, 'mean', 'max' or 'min', got {head_fusion!r}")
    if preallocate is not None:
        check_count("preallocate", preallocate)
    if keep_grad and (head_fusion is not None or queries not in (None, "all") or reduce is not None):
        raise ValueError("keep_grad=True records full maps; fuse heads, select queries or reduce after reading grads()")
    found = find_attention_modules(rm)
    chosen = _normalise_layers(layers, len(found))
    cap = _new_capture(model, found, chosen, head_fusion, queries, keep_grad, preallocate, reduce)
    hooks = _Hooks()
    # every module's own mode comes back after the block; checkpointed blocks would record outside the graph
    with eval_mode(model), no_checkpointing(model):
        try:
            for i in chosen:
                for b, m in enumerate(found[i].modules):
                    hooks.unfuse(m)
                    drop = getattr(m, "attn_drop", None)

                    def record(a: Tensor, i: int = i, b: int = b, h: int = int(m.num_heads)) -> None:
                        cap._record(i, b, a, h)

                    if isinstance(drop, nn.Module):
                        hooks.handles.append(drop.register_forward_hook(lambda _m, _a, out, rec=record: rec(out)))
                    else:
                        hooks.softmax(m, record)
            pool_module = _find_pool(model) if pool else None
            if pool_module is not None:
                hooks.unfuse(pool_module)
                hooks.softmax(pool_module, lambda a: cap.pool.append(a.detach().float()))
            yield cap
        finally:
            hooks.remove()


def _new_capture(model: nn.Module, found: list, chosen: list[int], head_fusion: HeadFusion | None, queries: Queries,
                 keep_grad: bool, preallocate: int | None, reduce: Reduction | None) -> AttentionCapture:
    """The empty capture of ``model``'s ``chosen`` layers (of ``found``), with its prefix tokens counted and its
    global layers known; ``AttentionCaptureError`` for a chosen layer that attends within windows."""
    n_prefix = int(getattr(model, "num_prefix_tokens", 0) or 0)
    if class_token_never_joins(model):  # a ConViT's blocks all run before its class token joins: none reaches them
        n_prefix -= 1
    cap = AttentionCapture(tuple(found[i] for i in chosen), len(found), head_fusion, queries, keep_grad, n_prefix,
                           preallocate=preallocate, reduce=reduce, class_token_joins=class_token_join(model))
    blocks = getattr(model, "blocks", None)
    if isinstance(blocks, (nn.Sequential, nn.ModuleList)) and any(hasattr(b, "window_size") for b in blocks):
        cap.global_layers = tuple(i for i, b in enumerate(blocks) if not getattr(b, "window_size", 0))
        windowed = [i for i in chosen if i not in cap.global_layers]
        if windowed:  # their maps are per window, with the windows folded into the batch: never images' maps
            raise AttentionCaptureError(
                f"blocks {windowed} of {type(model).__name__} attend within windows folded into the batch (windowed "
                "attention), not over the image's tokens, so they have no (B, H, T, T) map of each image: capture "
                f"the global-attention layers alone, layers={list(cap.global_layers)}")
    return cap


class _Hooks:
    """The hooks and unfused attention modules of one capture, all undone by ``remove`` (also after a forward
    raised between a pre- and a post-hook)."""

    def __init__(self) -> None:
        self.handles: list[torch.utils.hooks.RemovableHandle] = []
        self.fused: list[tuple[nn.Module, bool]] = []
        self.recorders: list[_SoftmaxRecorder] = []

    def unfuse(self, m: nn.Module) -> None:
        """Run ``m``'s attention explicitly (timm's ``fused_attn`` off) until ``remove``."""
        if hasattr(m, "fused_attn"):
            self.fused.append((m, m.fused_attn))
            m.fused_attn = False

    def softmax(self, module: nn.Module, on_maps) -> None:
        """Call ``on_maps`` with the last softmax ``module`` computes in each forward."""
        def pre(_m, _args):
            rec = _SoftmaxRecorder()
            rec.__enter__()
            self.recorders.append(rec)

        def post(_m, _args, _out):
            rec = self.recorders.pop()
            rec.__exit__(None, None, None)
            if rec.outputs:
                on_maps(rec.outputs[-1])

        self.handles.append(module.register_forward_pre_hook(pre))
        self.handles.append(module.register_forward_hook(post, always_call=True))

    def remove(self) -> None:
        for h in self.handles:
            h.remove()
        while self.recorders:  # a forward raised between pre- and post-hook
            self.recorders.pop().__exit__(None, None, None)
        for m, flag in self.fused:
            m.fused_attn = flag


HEAD_FUSIONS = ("mean", "max", "min")


def fuse_heads(attn: Tensor, how: str, dim: int = 1, keepdim: bool = False) -> Tensor:
    """Fuse the heads axis ``dim`` of attention maps by ``how`` in ``HEAD_FUSIONS`` (mean, max or min), as
    Abnar & Zuidema's rollout and the vit-explain code do; e.g. (B, H, T, T) -> (B, T, T)."""
    if how == "mean":
        return attn.mean(dim=dim, keepdim=keepdim)
    if how == "max":
        return attn.amax(dim=dim, keepdim=keepdim)
    if how == "min":
        return attn.amin(dim=dim, keepdim=keepdim)
    raise ValueError(f"head fusion must be one of {HEAD_FUSIONS}, got {how!r}")


def check_images(images: Tensor, model: AnyModel | None = None) -> None:
    """Refuse anything but a ``(B, C, H, W)`` batch of at least one image: the check every analysis that runs a
    model on ``images`` makes first, so a single image without its batch axis or an empty batch is named here
    instead of failing inside timm (or returning NaNs). With ``model``, also images the model cannot take: another
    channel count, size, device or precision (``check_input_channels``, ``check_input_size``, ``check_input_device``,
    ``check_input_dtype``), each named before any hook is set."""
    if not isinstance(images, Tensor):
        raise TypeError(f"images must be a (B, C, H, W) tensor, got {type(images).__name__}")
    if images.dim() != 4:
        last = images.dim() == 3 and images.shape[-1] in (1, 3, 4) and images.shape[0] not in (1, 3, 4)
        raise ValueError(f"images must be a (B, C, H, W) batch, got shape {tuple(images.shape)}"
                         + ("; it looks like one (H, W, C) image: pass images.permute(2, 0, 1)[None]" if last
                            else "; pass images[None] for one image" if images.dim() == 3 else ""))
    if len(images) == 0:
        raise ValueError(f"images is an empty batch (shape {tuple(images.shape)}): pass at least one image "
                         "(images[None] for one image)")
    if not images.is_floating_point():
        raise TypeError(f"images are {str(images.dtype).removeprefix('torch.')}: the analyses take preprocessed float "
                        "images (resized and normalised for the model), not raw pixels: load them with "
                        "vitlab.data.images.load_images(model, folder), or normalise them with vitlab.data.datasets.normalize")
    if model is not None:
        rm = resolve_model(model)
        check_input_channels(rm, images)
        check_input_size(rm, tuple(images.shape[-2:]))
        check_input_device(rm, images)
        check_input_dtype(rm, images)


def check_input_device(model: AnyModel, images: Tensor) -> None:
    """Refuse images on another device than the model's weights (CPU images for a model on the GPU), which fail
    inside the first layer with torch's bare device error. A model spread over several devices is not checked."""
    devices = {p.device for p in resolve_model(model).module.parameters()}
    if len(devices) == 1 and images.device != (dev := devices.pop()):
        raise ValueError(f"images are on {images.device} but the model is on {dev}: pass images.to('{dev}'), or move "
                         f"the model with model.to('{images.device}')")


def check_input_channels(model: AnyModel, images: Tensor) -> None:
    """Refuse a (B, C, H, W) batch whose C is not the channel count of the model's first convolution: a channels-last
    (B, H, W, C) batch (which the size check would misread as C x H px images) or greyscale images on an RGB model,
    which fail inside that convolution with a bare shape error. A model without a convolution is not checked."""
    conv = _input_conv(resolve_model(model).module)
    if conv is None or images.shape[1] == conv.in_channels:
        return
    want, have = conv.in_channels, images.shape[1]
    if images.shape[-1] == want:
        raise ValueError(f"images of shape {tuple(images.shape)} have {have} channels on axis 1 but the model takes "
                         f"{want}: they look channels-last (B, H, W, C); pass images.permute(0, 3, 1, 2)")
    raise ValueError(f"images have {have} channel(s) but the model takes {want}: give {want}-channel images "
                     "(vitlab.data.images.load_images converts every image to RGB for the model)")


def _input_conv(model: nn.Module) -> nn.Conv2d | None:
    """The convolution that takes the images: the one timm's ``pretrained_cfg["first_conv"]`` names (the first of
    several, as CrossViT's two), else the first ``Conv2d`` the model registers."""
    first = (getattr(model, "pretrained_cfg", None) or {}).get("first_conv")
    name = first[0] if isinstance(first, (list, tuple)) and first else first
    if isinstance(name, str):
        try:
            conv = model.get_submodule(name)
        except AttributeError:
            conv = None
        if isinstance(conv, nn.Conv2d):
            return conv
    return next((m for m in model.modules() if isinstance(m, nn.Conv2d)), None)


def check_input_dtype(model: AnyModel, images: Tensor) -> None:
    """Refuse float images of another precision than the model's weights (float32 images on a bfloat16 model,
    float64 on a float32 one), which fail inside the first convolution with a bare dtype error; inside an autocast
    region the model casts them itself."""
    dtypes = [p.dtype for p in resolve_model(model).module.parameters() if p.is_floating_point()]
    if not dtypes or images.dtype in dtypes or torch.is_autocast_enabled(images.device.type):
        return
    want = str(dtypes[0]).removeprefix("torch.")
    have = str(images.dtype).removeprefix("torch.")
    raise TypeError(f"images are {have} but the model's weights are {want}: pass images.to(torch.{want}), or run "
                    f"the model in {have} (model.to(torch.{have})) or inside torch.autocast")


def check_input_size(model: AnyModel, size: tuple[int, int]) -> None:
    """Refuse an (H, W) input that a ViT without a dynamic input size cannot take: its patch grid and position
    embeddings are built for one size (timm's own check is a bare AssertionError, and a hybrid's a raw tensor size
    mismatch deep in the forward). Models with ``dynamic_img_size`` and models without a patch embedding (CNNs)
    take any size."""
    model = resolve_model(model).module
    pe = getattr(model, "patch_embed", None)
    built = getattr(pe, "img_size", None)
    if built is None or getattr(model, "dynamic_img_size", False) or not getattr(pe, "strict_img_size", True):
        return
    built = (built, built) if isinstance(built, int) else tuple(int(v) for v in built)
    if tuple(size) != built:
        h, w = size
        raise ValueError(f"images are {h}x{w} px but this {type(model).__name__} is built for {built[0]}x{built[1]} "
                         "px (a fixed patch grid and position embeddings): resize the images to that size "
                         "(vitlab.data.images.load_images does it for the model), resample the model for theirs with "
                         f"vitlab.resize_for_finetuning(model, ({h}, {w})), or build a timm model with "
                         "dynamic_img_size=True")


def attention_maps(
    model: AnyModel,
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

    rm = resolve_model(model)
    model = rm.module
    check_images(images, rm)
    if batch_size is not None:
        check_count("batch_size", batch_size)
    chunks = images.split(batch_size or len(images))
    show = len(chunks) > 1 if progress is None else progress
    with torch.no_grad(), capture_attention(rm, layers=layers, head_fusion=head_fusion, queries=queries,
                                            preallocate=len(images)) as cap:
        for chunk in tqdm(chunks, desc="attention", disable=not show, leave=False):
            model(chunk)
        return cap.stack()
