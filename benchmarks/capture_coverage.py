"""Attention-capture coverage over every ViT-family architecture that timm registers.

Every registered name of the ViT-family entrypoint modules (``FAMILY_MODULES`` + ``EXTRA_MODULES``) is
planned at reduced depth (2 blocks), reduced image size (``PATCHES_PER_SIDE`` tokens per side) and 10 classes.
The plan is built on the meta device first (free) to fingerprint the reduced model: class, module tree, every
module's plain attributes (flags such as ``global_pool``, ``no_embed_class``, ``fused_attn``) and all
parameter/buffer shapes. Names with equal fingerprints are one *distinct architecture*: only the first is
built with random weights and run, the others inherit its result (``representative`` in the JSON).

A run is three forwards of the same ``(2, C, S, S)`` batch:

1. plain, attention fused as built (the baseline output);
2. inside ``vitlab.capture_attention`` (output must not move, maps must be ``(L, B, H, T, T)``);
3. through an *independent* recorder written here: every module with a ``fused_attn`` flag is switched to
   the unfused path and a ``TorchFunctionMode`` keeps the 4-D softmax outputs computed inside each transformer
   block (located through the model's ``blocks`` list, never through vitlab) and inside an ``attn_pool``.

Each name ends up ``captured`` (all checks pass), ``refused`` (vitlab raised ``AttentionCaptureError``),
``wrong`` (anything else: a bug) or ``build_failed`` (timm itself could not build or run it reduced).
Results go to a JSON file (``--out``) and a summary table on stdout; the exit status is 0.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import fnmatch
import gc
import hashlib
import json
import re
import sys
import time
import traceback
import warnings
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

if __package__ in (None, ""):  # run as a script: make the `benchmarks` package importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import timm
import timm.layers.weight_init
import torch
import torch.nn.functional as F
from timm.models._registry import _model_entrypoints
from torch import Tensor, nn
from torch.overrides import TorchFunctionMode
from tqdm.auto import tqdm

import vitlab
from benchmarks._util import machine_info
from vitlab.base.atomic import atomic_write_text
from vitlab.base.modes import explicit_attention

# timm modules whose every model is a ViT: global self-attention blocks over patch (+ prefix) tokens.
FAMILY_MODULES: tuple[str, ...] = (
    "vision_transformer", "vision_transformer_hybrid", "vision_transformer_relpos", "vision_transformer_sam",
    "deit", "eva", "beit", "naflexvit",
)
# Further modules whose models are plain ViTs on timm's attention/blocks (reasons in BENCHMARKS.md).
EXTRA_MODULES: dict[str, str] = {
    "qwen3_vit": "plain pre-norm ViT of timm EvaBlocks (RoPE), wrapped as `encoder.blocks` in the classifier",
    "gemma4_vit": "plain ViT, global attention with fused_attn/attn_drop (own Gemma4Attention), 2D RoPE",
    "deepseek_vit": "plain pre-norm ViT of timm AttentionRope blocks (RoPE), wrapped as `encoder.blocks`",
    "vitamin": "timm VisionTransformer (Block/Attention) behind a MbConv stem (a hybrid ViT)",
}
# Modules that reuse ViT parts but are not plain ViTs: not run by default (``--also`` runs them).
EXCLUDED_MODULES: dict[str, str] = {
    "cait": "class-attention blocks and talking-heads attention",
    "crossvit": "two token branches at different patch sizes with cross-attention",
    "pit": "pooling stages: the token count changes between stages",
    "twins": "locally-grouped (windowed) attention",
    "mobilevit": "transformer blocks on unfolded CNN feature maps inside a CNN",
    "swin_transformer": "windowed attention, hierarchical stages",
}

PATCHES_PER_SIDE = 4  # even, for Qwen's 2x2 token merger (DeepSeek's 3x3 aligner pads)
PATCHES_PER_SIDE_BY_MODULE = {"gemma4_vit": 6}  # its 3x3 soft-token pooler needs a grid divisible by 3
REDUCED_DEPTH = 2
NUM_CLASSES = 10  # a small head: in21k heads would only add init time and split identical architectures
BATCH = 2
LOGIT_RTOL = 1e-4  # max |capture - plain| / max(1, max |plain|)
MAP_ATOL = 1e-5
ROW_ATOL = 1e-4
# Per-module build adjustments so the two kept blocks still show the family's block mix.
FAMILY_KWARGS: dict[str, dict[str, Any]] = {
    "vision_transformer_sam": {"global_attn_indexes": (1,)},  # block 0 windowed, block 1 global, as in SAM
}
STATUSES = ("captured", "refused", "wrong", "build_failed")
_SEVERITY = {"captured": 0, "refused": 1, "wrong": 2}


@dataclass
class Result:
    """Outcome for one registered timm name."""

    name: str
    module: str
    status: str = "build_failed"
    message: str = ""
    cls: str = ""
    arch_key: str = ""  # fingerprint of the reduced model (see module docstring)
    design_key: str = ""  # class + module tree with all sizes erased
    representative: str = ""  # the name whose run this result was taken from ("" = run itself)
    build_kwargs: dict[str, Any] = field(default_factory=dict)
    input_shape: list[int] = field(default_factory=list)
    num_blocks: int | None = None
    map_shape: list[int] | None = None
    pool_shape: list[int] | None = None
    logits_max_diff: float | None = None
    maps_max_diff: float | None = None
    rowsum_max_err: float | None = None
    seconds: float = 0.0


# ----------------------------------------------------------------------------------------------- names
def module_of(name: str) -> str:
    """Short name of the timm module that registers ``name`` (e.g. ``"eva"``)."""
    return _model_entrypoints[name].__module__.rsplit(".", 1)[-1]


def family_names(modules: tuple[str, ...], pattern: str | None = None, limit: int | None = None) -> list[str]:
    """Registered timm names (no pretrained tags) from ``modules``, filtered by a glob, at most ``limit``."""
    names = [n for n in timm.list_models() if module_of(n) in modules]
    if pattern:
        names = [n for n in names if fnmatch.fnmatch(n, pattern)]
    return names[:limit] if limit else names


# ----------------------------------------------------------------------------------------------- building
def find_named(model: nn.Module, leaf: str) -> tuple[str, nn.Module] | None:
    """First submodule (pre-order) whose last name component is ``leaf``, as ``(qualified name, module)``."""
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] == leaf:
            return name, m
    return None


def find_blocks(model: nn.Module) -> list[nn.Module] | None:
    """The transformer blocks: the shallowest ``blocks`` ModuleList/Sequential (a hybrid's CNN backbone has
    deeper ``...stages.N.blocks`` lists)."""
    found = [(name.count("."), m) for name, m in model.named_modules()
             if name.rsplit(".", 1)[-1] == "blocks" and isinstance(m, (nn.ModuleList, nn.Sequential))]
    return list(min(found, key=lambda f: f[0])[1]) if found else None


def _as_int(v: Any) -> int:
    return int(max(v)) if isinstance(v, (tuple, list)) else int(v)


def token_stride(model: nn.Module, name: str) -> int:
    """Pixels per token side: the patch size, or a hybrid backbone's total stride."""
    hit = find_named(model, "patch_embed")
    if hit is not None:
        pe = hit[1]
        if hasattr(pe, "backbone") and callable(getattr(pe, "feat_ratio", None)):
            return _as_int(pe.feat_ratio())
        if getattr(pe, "patch_size", None) is not None:
            return _as_int(pe.patch_size)
    found = re.search(r"patch(\d+)", name)
    return int(found.group(1)) if found else 16


def _create(name: str, **kwargs: Any) -> nn.Module:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return timm.create_model(name, pretrained=False, **kwargs)


def per_block_kwargs(name: str, base: dict[str, Any]) -> dict[str, Any]:
    """Kwargs that timm wants once per block, read from a full-depth build on the meta device.

    Keeps blocks 0 and depth // 2, so that e.g. Sapiens2's grouped-query middle blocks stay represented.
    """
    full = _create(name, device="meta", **{k: v for k, v in base.items() if k != "depth"})
    blocks = find_blocks(full) or []
    keep = [blocks[0], blocks[len(blocks) // 2]] if blocks else []
    kv = [getattr(getattr(b, "attn", None), "num_kv_heads", None) for b in keep]
    return {"num_kv_heads": tuple(kv)} if kv and all(isinstance(k, int) for k in kv) else {}


def _repaired(name: str, base: dict[str, Any], err: Exception) -> dict[str, Any] | None:
    """Kwargs that fix a failed reduced build: drop an unknown ``depth``, or add per-block kwargs."""
    if isinstance(err, TypeError) and "depth" in str(err):
        return {k: v for k, v in base.items() if k != "depth"}
    try:
        extra = per_block_kwargs(name, base)
    except Exception:  # noqa: BLE001 - nothing to repair; the real build will report the error
        return None
    return {**base, **extra} if extra else None


def reduced_kwargs(name: str) -> tuple[dict[str, Any], int]:
    """``(kwargs, pixels per token side)`` to build ``name`` at depth 2, found with cheap meta builds."""
    base: dict[str, Any] = {"depth": REDUCED_DEPTH, **FAMILY_KWARGS.get(module_of(name), {})}
    for _ in range(2):
        try:
            return base, token_stride(_create(name, device="meta", **base), name)
        except Exception as e:  # noqa: BLE001
            fixed = _repaired(name, base, e)
            if fixed is None:
                break
            base = fixed
    return base, token_stride(nn.Module(), name)  # stride from the name; the real build decides


def default_size(model: nn.Module) -> int:
    """Default input side of ``model`` from its pretrained config."""
    return int(getattr(model, "pretrained_cfg", {}).get("input_size", (3, 224, 224))[-1])


def in_chans(model: nn.Module) -> int:
    """Input channels of ``model`` from its pretrained config."""
    return int(getattr(model, "pretrained_cfg", {}).get("input_size", (3,))[0])


Attempt = tuple[dict[str, Any], int | None]  # (create_model kwargs, input side in pixels or None = default)


@dataclass
class Plan:
    """How to build one name reduced: attempts in order, and the structure keys of the first that builds."""

    attempts: list[Attempt]
    arch_key: str
    design_key: str


def fingerprint(model: nn.Module) -> str:
    """Hash of every module's class and plain attributes plus all parameter and buffer shapes."""
    parts = []
    for name, m in model.named_modules():
        attrs = sorted((k, v) for k, v in vars(m).items()
                       if not k.startswith("_") and isinstance(v, (bool, int, float, str, tuple, type(None))))
        parts.append(f"{name}:{type(m).__module__}.{type(m).__qualname__}:{attrs!r}")
    parts += [f"{k}:{tuple(v.shape)}" for k, v in (*model.named_parameters(), *model.named_buffers())]
    return _hash("\n".join(parts))


def design_key(model: nn.Module) -> str:
    """Hash of the class and module tree with every number erased (ViT-S and ViT-B share a design)."""
    return _hash(re.sub(r"\d+(\.\d+)?(e-?\d+)?", "#", f"{type(model).__qualname__}\n{model!r}"))


def plan(name: str) -> Plan:
    """Build attempts for ``name`` (reduced first, default size last), keyed by a meta-device build."""
    base, stride = reduced_kwargs(name)
    side = PATCHES_PER_SIDE_BY_MODULE.get(module_of(name), PATCHES_PER_SIDE) * stride
    attempts: list[Attempt] = [
        ({**base, "img_size": side, "num_classes": NUM_CLASSES}, side),
        ({**base, "img_size": side}, side),
        ({**base, "num_classes": NUM_CLASSES}, side),
        (base, None),
    ]
    for i, (kwargs, _) in enumerate(attempts):
        try:
            meta = _create(name, device="meta", **kwargs)
        except Exception:  # noqa: BLE001 - try the next attempt
            continue
        return Plan(attempts[i:], fingerprint(meta), design_key(meta))
    return Plan(attempts, f"name:{name}", f"name:{name}")


@contextlib.contextmanager
def fast_init() -> Iterator[None]:
    """timm's truncated-normal init replaced by a clamped normal (7x faster per tensor; weights stay random)."""
    def clamped_normal(tensor: Tensor, mean: float = 0.0, std: float = 1.0, a: float = -2.0, b: float = 2.0,
                       *_: Any, **__: Any) -> Tensor:
        with torch.no_grad():
            return tensor.normal_(mean, std).clamp_(a, b)

    saved = timm.layers.weight_init._trunc_normal_, nn.init.trunc_normal_
    timm.layers.weight_init._trunc_normal_ = clamped_normal
    nn.init.trunc_normal_ = clamped_normal
    try:
        yield
    finally:
        timm.layers.weight_init._trunc_normal_, nn.init.trunc_normal_ = saved


def build_reduced(name: str, attempts: list[Attempt]) -> tuple[nn.Module, Tensor, dict[str, Any], Tensor]:
    """``(model, x, kwargs, plain output)`` of the first attempt that builds and runs.

    The model is in eval mode with random weights; ``x`` is a ``(2, C, S, S)`` batch; the plain output is
    flattened to ``(B, features)`` float32. Raises ``RuntimeError`` listing every attempt's error.
    """
    errors = []
    for kwargs, side in attempts:
        try:
            torch.manual_seed(0)
            with fast_init():
                model = _create(name, **kwargs).eval()
            side = side or default_size(model)
            x = torch.randn(BATCH, in_chans(model), side, side, generator=torch.Generator().manual_seed(1))
            with torch.no_grad():
                out = flat_output(model(x))
            return model, x, kwargs, out
        except Exception as e:  # noqa: BLE001 - any failure here means: try the next way to build it
            errors.append(f"{_jsonable(kwargs)} @ {side}px: {type(e).__name__}: {_short(e)}")
            gc.collect()
    raise RuntimeError(" | ".join(errors))


# ----------------------------------------------------------------------------------------------- outputs
def tensors_of(out: Any) -> list[Tensor]:
    """All floating tensors in a model output (tensor, tuple/list or dict), in a stable order."""
    if isinstance(out, Tensor):
        return [out] if out.is_floating_point() else []
    if isinstance(out, dict):
        return [t for k in sorted(out) for t in tensors_of(out[k])]
    if isinstance(out, (tuple, list)):
        return [t for v in out for t in tensors_of(v)]
    return []


def flat_output(out: Any) -> Tensor:
    """The model output flattened into one float32 vector per sample: ``(B, sum of features)``."""
    ts = tensors_of(out)
    if not ts:
        raise TypeError(f"model output {type(out).__name__} holds no floating tensor")
    return torch.cat([t.detach().float().reshape(t.shape[0], -1) for t in ts], dim=1)


def rel_diff(a: Tensor, b: Tensor) -> float:
    """max |a - b| / max(1, max |b|); inf when the shapes differ."""
    if a.shape != b.shape:
        return float("inf")
    return float((a - b).abs().max() / max(1.0, float(b.abs().max())))


# ----------------------------------------------------------------------------------------------- reference
_SOFTMAX = {torch.softmax, Tensor.softmax, F.softmax, torch.special.softmax}
_SDPA = {F.scaled_dot_product_attention}
_MATMUL = {torch.matmul, Tensor.matmul, Tensor.__matmul__}


class SoftmaxLog(TorchFunctionMode):
    """Per scope (set by hooks): every 4-D softmax output, every attention-like matrix multiplied into
    something (a 4-D left matmul operand that is square or shaped like the last softmax), and SDPA calls."""

    def __init__(self) -> None:
        super().__init__()
        self.scope: list[str] = []
        self.maps: dict[str, list[Tensor]] = defaultdict(list)  # scope -> [(B, H, Q, K), ...]
        self.applied: dict[str, list[Tensor]] = defaultdict(list)  # scope -> [(B, H, Q, K), ...]
        self.sdpa: Counter[str] = Counter()

    def __torch_function__(self, func: Callable, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        out = func(*args, **(kwargs or {}))
        if not self.scope:
            return out
        scope = self.scope[-1]
        if func in _SOFTMAX and isinstance(out, Tensor) and out.dim() == 4:
            self.maps[scope].append(out.detach().float().clone())
        elif func in _MATMUL and isinstance(args[0], Tensor) and args[0].dim() == 4:
            a, last = args[0], self.maps[scope][-1:]
            if a.shape[-1] == a.shape[-2] or (last and a.shape == last[0].shape):
                self.applied[scope].append(a.detach().float().clone())
        elif func in _SDPA:
            self.sdpa[scope] += 1
        return out


@dataclass
class Reference:
    """What the independent recorder saw in one unfused forward (keys "block{i}" and "pool")."""

    maps: dict[str, list[Tensor]]  # softmax outputs, (B, H, Q, K) each
    applied: dict[str, list[Tensor]]  # matrices multiplied into the values; the last one is the attention
    sdpa: Counter[str]
    tokens: dict[str, int | None]  # "block{i}" -> tokens T entering the block


def _tokens(args: tuple, kwargs: dict) -> int | None:
    """T of a block input: ``(B, T, C)`` tokens or ``(B, H, W, C)`` grids; None for anything else."""
    x = args[0] if args else next(iter(kwargs.values()), None)
    if not isinstance(x, Tensor) or x.dim() not in (3, 4):
        return None
    return int(x.shape[1]) if x.dim() == 3 else int(x.shape[1] * x.shape[2])


def reference_attention(model: nn.Module, x: Tensor) -> Reference:
    """Run ``model`` unfused under ``SoftmaxLog``, scoped to each block and to the attention pool."""
    log, tokens, handles = SoftmaxLog(), {}, []  # tokens: "block{i}" -> T
    scopes = [(f"block{i}", b) for i, b in enumerate(find_blocks(model) or [])]
    pool = find_named(model, "attn_pool")
    if pool is not None and isinstance(pool[1], nn.Module):
        scopes.append(("pool", pool[1]))

    def enter(scope: str) -> Callable:
        def pre(_m: nn.Module, args: tuple, kwargs: dict) -> None:
            log.scope.append(scope)
            if scope != "pool":
                tokens[scope] = _tokens(args, kwargs)
        return pre

    def leave(*_: Any) -> None:  # returns None: a forward hook's return value would replace the output
        log.scope.pop()

    try:
        for scope, m in scopes:
            handles.append(m.register_forward_pre_hook(enter(scope), with_kwargs=True))
            handles.append(m.register_forward_hook(leave, always_call=True))
        with torch.no_grad(), explicit_attention(model), log:
            model(x)
    finally:
        for h in handles:
            h.remove()
    return Reference(dict(log.maps), dict(log.applied), log.sdpa, tokens)


# ----------------------------------------------------------------------------------------------- checks
def model_state(model: nn.Module) -> tuple:
    """Fused flags, training flags and hook counts: what capture must leave as it found it."""
    return tuple(
        (getattr(m, "fused_attn", None), m.training, len(m._forward_hooks), len(m._forward_pre_hooks))
        for m in model.modules()
    )


def compare_block_maps(maps: Tensor, ref: Reference, n_blocks: int, batch: int) -> tuple[list[str], float]:
    """Problems with vitlab's ``(L, B, H, T, T)`` maps against the reference, and the max abs difference.

    Per block the map must be ``(B, H, T, T)`` with T the block's token count, equal one of the block's
    softmax outputs, and equal the matrix the block then multiplies into its values. A block with parallel
    attention branches must give the branches' maps joined along the head axis, in branch order.
    """
    if maps.dim() != 5 or maps.shape[0] != n_blocks:
        return [f"stack() shape {tuple(maps.shape)} for {n_blocks} blocks"], float("inf")
    problems, worst = [], 0.0
    for i in range(n_blocks):
        key, got = f"block{i}", maps[i]
        T = ref.tokens.get(key)
        if got.shape[0] != batch or got.shape[-1] != T or got.shape[-2] != T:
            problems.append(f"block {i}: map {tuple(got.shape)} is not (B={batch}, H, T={T}, T={T})")
        outs = [w for w in ref.maps.get(key, []) if w.dim() == 4]
        candidates = outs + ([torch.cat(outs, dim=1)] if len(outs) > 1 else [])
        same = [w for w in candidates if w.shape == got.shape]
        if not same:
            why = f"{ref.sdpa[key]} fused SDPA call(s)" if ref.sdpa[key] else "no 4-D softmax of that shape"
            problems.append(f"block {i}: reference softmax outputs {[tuple(w.shape) for w in ref.maps.get(key, [])]}"
                            f" ({why})")
            worst = float("inf")
            continue
        d = min(float((got - w).abs().max()) for w in same)
        worst = max(worst, d)
        if d > MAP_ATOL:
            problems.append(f"block {i}: maps differ from the reference softmax by {d:.2e}")
        problems += compare_applied(i, got, ref.applied.get(key, []))
    return problems, worst


def compare_applied(i: int, got: Tensor, applied: list[Tensor]) -> list[str]:
    """Problems when block ``i``'s captured map ``(B, H, T, T)`` is not the one matrix it multiplies into V."""
    if len(applied) > 1:
        joined = torch.cat(applied, dim=1) if len({a.shape[2:] for a in applied}) == 1 else None
        if joined is None or joined.shape != got.shape or float((joined - got).abs().max()) > MAP_ATOL:
            return [f"block {i} multiplies {len(applied)} attention matrices into values (parallel attention "
                    f"branches) and vitlab's map is not their head-wise concatenation"]
        return []
    if applied and (applied[0].shape != got.shape or float((applied[0] - got).abs().max()) > MAP_ATOL):
        return [f"block {i}: the captured softmax {tuple(got.shape)} is not the attention matrix the block "
                f"multiplies into its values {tuple(applied[0].shape)}"]
    return []


def compare_pool(pool: Tensor | None, ref: Reference) -> list[str]:
    """Problems with vitlab's ``pool_maps()`` ``(B, H, Lq, N)`` against the reference pool softmax."""
    want = ref.maps.get("pool", [])
    if pool is None and not want:
        return []
    if pool is None:
        return [f"attention pool ran a softmax {tuple(want[-1].shape)} but pool_maps() is None"]
    if not want:
        return [f"pool_maps() gave {tuple(pool.shape)} but the reference saw no pool softmax"]
    if pool.shape != want[-1].shape or float((pool - want[-1]).abs().max()) > MAP_ATOL:
        return [f"pool_maps() {tuple(pool.shape)} differs from the reference {tuple(want[-1].shape)}"]
    return []


def capture_checks(res: Result, model: nn.Module, x: Tensor, plain: Tensor) -> None:
    """Run vitlab on ``model`` and fill ``res.status`` / ``res.message`` and the numbers."""
    before = model_state(model)
    try:
        with torch.no_grad(), vitlab.capture_attention(model) as cap:
            out = flat_output(model(x))
            maps = cap.stack()
            pool = cap.pool_maps()
    except vitlab.AttentionCaptureError as e:
        restored = model_state(model) == before
        res.status = "refused" if restored else "wrong"
        res.message = str(e) if restored else f"refused, but left fused flags/hooks/modes changed: {e}"
        return
    except Exception as e:  # noqa: BLE001 - any other exception from vitlab is a bug we report
        res.status, res.message = "wrong", f"{type(e).__name__}: {_short(e)} [{_where(e)}]"
        return
    problems = [] if model_state(model) == before else ["model state (fused flags/hooks/modes) not restored"]
    try:
        ref = reference_attention(model, x)
    except Exception as e:  # noqa: BLE001 - the model runs but our reference cannot follow it
        res.status = "wrong"
        res.message = f"vitlab returned {tuple(maps.shape)}, unverified: the reference failed ({type(e).__name__})"
        return
    n_blocks = len(find_blocks(model) or ref.tokens)
    res.num_blocks, res.map_shape = n_blocks, list(maps.shape)
    res.pool_shape = list(pool.shape) if pool is not None else None
    res.logits_max_diff = rel_diff(out, plain)
    if res.logits_max_diff > LOGIT_RTOL:
        problems.append(f"output changed under capture by {res.logits_max_diff:.2e} (relative)")
    if maps.numel() == 0:
        problems.append("empty maps")
    else:
        res.rowsum_max_err = float((maps.sum(-1) - 1).abs().max())
        if res.rowsum_max_err > ROW_ATOL:
            problems.append(f"rows do not sum to 1 (max error {res.rowsum_max_err:.2e})")
    block_problems, res.maps_max_diff = compare_block_maps(maps, ref, n_blocks, x.shape[0])
    problems += block_problems + compare_pool(pool, ref)
    res.status, res.message = ("wrong", "; ".join(problems)) if problems else ("captured", "")


def check(name: str, p: Plan) -> Result:
    """Build ``name`` reduced (following ``p``) and classify vitlab's capture on it."""
    t0 = time.perf_counter()
    res = Result(name=name, module=module_of(name), arch_key=p.arch_key, design_key=p.design_key)
    try:
        model, x, kwargs, plain = build_reduced(name, p.attempts)
    except Exception as e:  # noqa: BLE001
        res.message = _short(e, 800)
        res.seconds = time.perf_counter() - t0
        return res
    res.cls, res.build_kwargs, res.input_shape = type(model).__name__, _jsonable(kwargs), list(x.shape)
    capture_checks(res, model, x, plain)
    del model
    gc.collect()
    res.seconds = round(time.perf_counter() - t0, 2)
    return res


# ----------------------------------------------------------------------------------------------- summary
def group_status(statuses: list[str]) -> str:
    """Worst status among the names that ran (wrong > refused > captured); build_failed if none ran."""
    ran = [s for s in statuses if s != "build_failed"]
    return max(ran, key=_SEVERITY.__getitem__) if ran else "build_failed"


def summarise(results: list[Result]) -> dict[str, Any]:
    """Counts per registered name, per distinct architecture, per design and per timm module."""
    def grouped(key: str) -> Counter[str]:
        groups: dict[str, list[str]] = defaultdict(list)
        for r in results:
            groups[getattr(r, key)].append(r.status)
        return Counter(group_status(v) for v in groups.values())

    per_module: dict[str, Counter[str]] = defaultdict(Counter)
    for r in results:
        per_module[r.module][r.status] += 1
    return {
        "per_name": {s: Counter(r.status for r in results)[s] for s in STATUSES},
        "per_architecture": {s: grouped("arch_key")[s] for s in STATUSES},
        "per_design": {s: grouped("design_key")[s] for s in STATUSES},
        "per_module": {m: {s: c[s] for s in STATUSES} for m, c in sorted(per_module.items())},
    }


def format_table(summary: dict[str, Any]) -> str:
    """Markdown table: rows = counting unit, columns = statuses."""
    head = "| counted per | " + " | ".join(STATUSES) + " | total |"
    lines = [head, "|" + "---|" * (len(STATUSES) + 2)]
    for label, key in (("registered name", "per_name"), ("distinct architecture", "per_architecture"),
                       ("design (sizes erased)", "per_design")):
        c = summary[key]
        lines.append(f"| {label} | " + " | ".join(str(c[s]) for s in STATUSES) + f" | {sum(c.values())} |")
    return "\n".join(lines)


def format_module_table(summary: dict[str, Any]) -> str:
    """Markdown table of status counts per timm module (per registered name)."""
    lines = ["| timm module | " + " | ".join(STATUSES) + " |", "|" + "---|" * (len(STATUSES) + 1)]
    for m, c in summary["per_module"].items():
        lines.append(f"| {m} | " + " | ".join(str(c[s]) for s in STATUSES) + " |")
    return "\n".join(lines)


def format_problems(results: list[Result]) -> str:
    """One line per non-captured name, grouped by status."""
    lines = []
    for status in ("wrong", "refused", "build_failed"):
        hits = [r for r in results if r.status == status]
        if hits:
            lines.append(f"\n{status} ({len(hits)}):")
            lines += [f"  {r.name} [{r.module}/{r.cls}]: {r.message[:300]}" for r in hits]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- helpers
def _short(e: BaseException, n: int = 300) -> str:
    return " ".join(str(e).split())[:n]


def _where(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    return f"{Path(tb[-1].filename).name}:{tb[-1].lineno}" if tb else "?"


def _hash(s: str) -> str:
    return hashlib.sha1(s.encode()).hexdigest()[:12]


def _jsonable(d: dict[str, Any]) -> dict[str, Any]:
    return {k: list(v) if isinstance(v, tuple) else v for k, v in d.items()}


def run_coverage(pattern: str | None = None, limit: int | None = None, extra: bool = True,
                 also: tuple[str, ...] = (), progress: bool = True) -> tuple[list[Result], dict[str, Any]]:
    """Check every selected name (one run per distinct architecture); returns results and summary counts."""
    modules = FAMILY_MODULES + (tuple(EXTRA_MODULES) if extra else ()) + also
    results, runs = [], {}
    bar = tqdm(family_names(modules, pattern, limit), desc="capture coverage", disable=not progress,
               dynamic_ncols=True)
    for name in bar:
        bar.set_postfix_str(name)
        p = plan(name)
        rep = runs.get(p.arch_key)
        if rep is None:
            rep = runs[p.arch_key] = check(name, p)
            results.append(rep)
        else:
            results.append(dataclasses.replace(rep, name=name, module=module_of(name), representative=rep.name,
                                               seconds=0.0))
    return results, summarise(results)


def timed_coverage(pattern: str | None = None, limit: int | None = None, extra: bool = True,
                   also: tuple[str, ...] = (), threads: int = 1) -> tuple[list[Result], dict[str, Any], float]:
    """``run_coverage`` with ``threads`` torch threads (restored after), plus its wall-clock seconds."""
    saved, t0 = torch.get_num_threads(), time.perf_counter()
    torch.set_num_threads(threads)
    try:
        results, summary = run_coverage(pattern, limit, extra, also)
    finally:
        torch.set_num_threads(saved)
    return results, summary, time.perf_counter() - t0


def write_json(path: Path, results: list[Result], summary: dict[str, Any], seconds: float,
               machine: dict[str, Any] | None = None) -> None:
    """Per-model results plus summary and run metadata; ``machine``: ``machine_info()`` as the run started (its load
    average before the run's own work; None: as it is now)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "machine": machine or machine_info(), "seconds": round(seconds, 1),
        "modules": list(FAMILY_MODULES), "extra_modules": EXTRA_MODULES,
        "settings": {"depth": REDUCED_DEPTH, "patches_per_side": PATCHES_PER_SIDE, "batch": BATCH,
                     "logit_rtol": LOGIT_RTOL, "map_atol": MAP_ATOL},
        "summary": summary,
        "results": [asdict(r) for r in results],
    }
    atomic_write_text(path, json.dumps(doc, indent=1, default=str))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (1: these tiny forwards are fastest single-threaded, also on a busy machine)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/results/capture_coverage.partial.json"))
    p.add_argument("--filter", metavar="GLOB", help="only names matching this glob, e.g. 'deit*'")
    p.add_argument("--limit", type=int, help="at most this many names (after --filter)")
    p.add_argument("--no-extra", action="store_true", help=f"skip {', '.join(EXTRA_MODULES)}")
    p.add_argument("--also", nargs="+", default=[], metavar="MODULE",
                   help=f"also run these timm modules, e.g. the non-plain ViTs {' '.join(EXCLUDED_MODULES)}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    machine = machine_info()  # the load before the run's own work
    results, summary, seconds = timed_coverage(args.filter, args.limit, not args.no_extra, tuple(args.also),
                                               args.threads)
    write_json(args.out, results, summary, seconds, machine)
    print(format_table(summary))
    print()
    print(format_module_table(summary))
    print(format_problems(results))
    print(f"\n{len(results)} names in {seconds:.0f} s; per-model results in {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
