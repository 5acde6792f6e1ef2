"""The residual stream of a ViT, shared by the similarity, head and token analyses: each block's output tokens
(``capture_blocks``), the input of the first block (``block_zero_input``) and the run from one block's input to the
logits (``run_from``).

Block ``l``'s output is the (B, T_l, D) token sequence the block returns, before the model's final norm; T_l counts
the prefix tokens that exist in that block (a ConViT's blocks before its class token joins, ``class_token_join``,
hold the N patches alone: their prefix count is one less). Hooks are set only inside context managers and removed in
``finally``, also when the body raises.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import Tensor, nn

from vitlab.base.modes import eval_mode, no_checkpointing
from vitlab.inspect.capture import AttentionCaptureError, find_attention_modules
from vitlab.models.info import AnyModel, class_token_join, class_token_never_joins, resolve_model

__all__ = ["BlockReduction", "block_list", "prefix_counts", "capture_blocks", "block_zero_input", "run_from",
           "tail_matches"]

#: ``reduce(layer, tokens, num_prefix)`` -> what to keep of block ``layer``'s (B, T_l, D) output, whose first
#: ``num_prefix`` tokens are its prefix tokens; None keeps nothing (a reduction that accumulates its own state).
BlockReduction = Callable[[int, Tensor, int], "Tensor | None"]


def block_list(model: AnyModel) -> nn.Module:
    """``model.blocks``, the ViT's transformer blocks in depth order, after checking that vitlab captures the model
    (``find_attention_modules``: CaiT, CNNs and differential or talking-heads attention are refused with its
    ``AttentionCaptureError``) and that the blocks are its top-level ``blocks``."""
    rm = resolve_model(model)
    model = rm.module
    find_attention_modules(rm)  # refuses what vitlab does not capture, with the reason
    blocks = getattr(model, "blocks", None)
    if not isinstance(blocks, (nn.Sequential, nn.ModuleList)) or len(blocks) == 0:
        raise AttentionCaptureError(f"{type(model).__name__} keeps its transformer blocks elsewhere than in a "
                                    "`blocks` list: the residual-stream analyses read model.blocks")
    return blocks


def prefix_counts(model: AnyModel) -> list[int]:
    """Per block, how many prefix tokens lead its input and output: the model's ``num_prefix_tokens``, one less in a
    ConViT's blocks before its class token joins (or in all of them when it never joins)."""
    rm = resolve_model(model)
    model = rm.module
    n, depth = int(getattr(model, "num_prefix_tokens", 0) or 0), len(block_list(rm))
    if class_token_never_joins(model):
        return [n - 1] * depth
    join = class_token_join(model)
    return [n - 1 if i < join else n for i in range(depth)]


@contextlib.contextmanager
def capture_blocks(model: AnyModel, reduce: BlockReduction, layers: tuple[int, ...] | None = None
                   ) -> Iterator[dict[int, list[Tensor]]]:
    """Inside the block, every forward of ``model`` hands each chosen block's (B, T_l, D) output (detached) to
    ``reduce``; the dict yielded keeps, per layer, what ``reduce`` returned for each call. The model runs in eval mode
    and without gradient checkpointing; its modes and hooks are restored on exit, also when the body raises. A block
    whose output is no (B, T, D) sequence (windowed attention keeps a (B, h, w, D) grid) raises
    ``AttentionCaptureError`` naming it."""
    rm = resolve_model(model)
    model = rm.module
    blocks = block_list(rm)
    prefix = prefix_counts(rm)
    chosen = tuple(range(len(blocks))) if layers is None else tuple(layers)
    kept: dict[int, list[Tensor]] = {i: [] for i in chosen}
    handles: list[torch.utils.hooks.RemovableHandle] = []

    def hook(i: int) -> Callable:
        def on_output(_m: nn.Module, _args: tuple, out: Tensor) -> None:
            if not isinstance(out, Tensor) or out.dim() != 3:
                shape = tuple(out.shape) if isinstance(out, Tensor) else type(out).__name__
                raise AttentionCaptureError(f"block {i} of {type(model).__name__} returns {shape}, not a (B, T, D) "
                                            "token sequence (windowed attention?): the residual-stream analyses need "
                                            "global blocks over the image's tokens")
            r = reduce(i, out.detach(), prefix[i])
            if r is not None:
                kept[i].append(r)
        return on_output

    with eval_mode(model), no_checkpointing(model):
        try:
            for i in chosen:
                handles.append(blocks[i].register_forward_hook(hook(i)))
            yield kept
        finally:
            for h in handles:
                h.remove()


class _Stop(Exception):
    """Raised by a hook to end a forward once it has what it needs."""


@torch.no_grad()
def block_zero_input(model: AnyModel, images: Tensor) -> Tensor:
    """(B, T_0, D): the tokens block 0 receives for ``images`` (patch embedding, position embedding, prefix tokens
    and ``norm_pre`` applied by the model itself); the forward stops there, so no block runs."""
    rm = resolve_model(model)
    model = rm.module
    got: list[Tensor] = []

    def grab(_m: nn.Module, args: tuple) -> None:
        got.append(args[0])
        raise _Stop

    with eval_mode(model):
        handle = block_list(rm)[0].register_forward_pre_hook(grab)
        try:
            model(images)
        except _Stop:
            pass
        finally:
            handle.remove()
    if not got:
        raise AttentionCaptureError(f"{type(model).__name__}'s forward never ran its block 0")
    return got[0]


def run_from(model: AnyModel, layer: int, x: Tensor, stop: int | None = None) -> Tensor:
    """Run ``model`` from block ``layer``'s input ``x`` (B, T_layer, D): blocks ``layer`` .. ``stop - 1`` (a ConViT's
    class token joining before its block ``class_token_join``, as its own forward does it), then, with ``stop=None``,
    the final ``norm`` and ``forward_head``: the (B, K) logits. With ``stop``, the input of block ``stop`` instead.
    Valid for a model whose forward is exactly that sequence (timm's VisionTransformer, DeiT, ConViT); check a model
    with ``tail_matches`` before trusting it (blocks that take extra arguments, as EVA's rotary embedding, differ)."""
    rm = resolve_model(model)
    model = rm.module
    blocks = block_list(rm)
    join = class_token_join(model)
    end = len(blocks) if stop is None else stop
    for i in range(layer, end):
        if join and i == join:  # timm's ConViT: the class token joins before block local_up_to_layer
            x = torch.cat((model.cls_token.expand(x.shape[0], -1, -1), x), dim=1)
        x = blocks[i](x)
    if stop is not None:
        return x
    return model.forward_head(model.norm(x))


@torch.no_grad()
def tail_matches(model: AnyModel, images: Tensor, logits: Tensor | None = None, rtol: float = 1e-4,
                 atol: float = 1e-4) -> bool:
    """Whether ``run_from(model, 0, block_zero_input(model, images))`` gives the model's own logits for ``images``
    (``logits``, computed when not given), within ``rtol``/``atol``: the check that ``run_from`` follows this model's
    forward. False for a model without ``norm`` and ``forward_head``."""
    rm = resolve_model(model)
    model = rm.module
    if not isinstance(getattr(model, "norm", None), nn.Module) or not callable(getattr(model, "forward_head", None)):
        return False
    with eval_mode(model):
        if logits is None:
            logits = model(images)
        try:
            ours = run_from(rm, 0, block_zero_input(rm, images))
        except (TypeError, RuntimeError):  # blocks that need more than x
            return False
    return isinstance(ours, Tensor) and ours.shape == logits.shape and torch.allclose(ours, logits, rtol=rtol,
                                                                                      atol=atol)
