"""Speed of the inspection analyses: mean attention distance over 128 images and rollout over a batch of 64
for ViT-B/16 at 224 px, against (a) a plain unfused forward over the same images and (b) the loop
implementations others publish, re-implemented here, all in one process.

    python benchmarks/inspect_speed.py [--model vit_base_patch16_224] [--distance-images 128] [--rollout-images 64]

Loop references, written after the published code (no code copied):

* distance as in probing-vits (Sayak Paul & Aritra Roy Gosthipaty): a patch-to-patch distance matrix built
  with a Python double loop over patches for every layer, then a numpy weighted sum over the captured maps;
* rollout as in vit-explain (Jacob Gildenblat): one image at a time through the model with attention
  recorded, then a per-image loop over layers (heads fused, discard, ``(A + I) / 2``, rows renormalised: the
  published code's ``a / a.sum(dim=-1)`` broadcasts over the wrong axis; here it is done as intended).

Ratios: "ours / forward" (goal <= 1.5) and "loop / ours" (goal >= 20), the latter both for the analysis step
alone (same captured maps in, distances or rollout out) and end to end (forward included).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

if __package__ in (None, ""):
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np
import timm
import torch

import vitlab
from benchmarks._util import plain_forward, report
from vitlab.inspect.distance import attention_distance_from_maps
from vitlab.inspect.rollout import readout_vector, rollout_row

GOAL_FORWARD = 1.5  # ours / plain unfused forward
GOAL_LOOP = 20.0  # loop reference / ours


def _timed(fn, *args, **kwargs) -> tuple[float, object]:
    t = time.perf_counter()
    out = fn(*args, **kwargs)
    return time.perf_counter() - t, out


# ------------------------------------------------------------------------------------ loop references
def distance_matrix_loops(patch_size: int, num_patches: int, length: int) -> np.ndarray:
    """probing-vits style: (N, N) pixel distances between patches, one Python iteration per pair."""
    out = np.zeros((num_patches, num_patches))
    for i in range(num_patches):
        for j in range(num_patches):
            if i == j:
                continue
            xi, yi = i // length, i % length
            xj, yj = j // length, j % length
            out[i, j] = patch_size * np.linalg.norm([xi - xj, yi - yj])
    return out


def distance_loops(maps: torch.Tensor, patch_size: int, num_prefix: int) -> np.ndarray:
    """(L, B, H, T, T) maps -> (L, H): per layer, the matrix rebuilt by loops, then weighted sums in numpy."""
    out = []
    for layer in maps.numpy():
        attn = layer[..., num_prefix:, num_prefix:]
        n = attn.shape[-1]
        dm = distance_matrix_loops(patch_size, n, int(np.sqrt(n)))[None, None]
        out.append((attn * dm).sum(-1).mean(-1).mean(0))  # (H,)
    return np.stack(out)


def rollout_one_image(attentions: list[torch.Tensor], discard_ratio: float = 0.0) -> torch.Tensor:
    """vit-explain style for one image: ``attentions`` L tensors (1, H, T, T) -> (N,) class-token row."""
    T = attentions[0].shape[-1]
    result = torch.eye(T)
    for attention in attentions:
        fused = attention.mean(dim=1)
        flat = fused.view(fused.size(0), -1)
        k = int(flat.size(-1) * discard_ratio)
        if k:
            _, idx = flat.topk(k, -1, False)
            idx = idx[idx != 0]
            flat[0, idx] = 0
        a = (fused + torch.eye(T)) / 2
        a = a / a.sum(dim=-1, keepdim=True)
        result = a @ result
    return result[0, 0, 1:]


def rollout_loop_step(maps: torch.Tensor) -> torch.Tensor:
    """The per-image rollout over already captured (L, B, H, T, T) maps."""
    return torch.stack([rollout_one_image(list(maps[:, b:b + 1])) for b in range(maps.shape[1])])


def rollout_loop_end_to_end(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """One image at a time: forward with attention recorded, then the per-image rollout."""
    rows = []
    with torch.no_grad():
        for i in range(len(x)):
            with vitlab.capture_attention(model) as cap:
                model(x[i:i + 1])
            rows.append(rollout_one_image(list(cap.stack())))
    return torch.stack(rows)


# ------------------------------------------------------------------------------------ benchmark
def run(model_name: str = "vit_base_patch16_224", distance_images: int = 128, rollout_images: int = 64,
        batch: int = 32) -> dict:
    torch.manual_seed(0)
    model = timm.create_model(model_name, pretrained=False).eval()  # speed does not depend on the weights
    info = vitlab.model_info(model)
    x = torch.randn(max(distance_images, rollout_images), 3, *info.img_size)
    xd, xr = x[:distance_images], x[:rollout_images]
    p, patch = info.num_prefix_tokens, info.patch_size[0]
    res: dict = {"model": model_name, "img_size": list(info.img_size), "batch": batch,
                 "threads": torch.get_num_threads(), "distance_images": distance_images,
                 "rollout_images": rollout_images}
    plain_forward(model, x[:batch], batch)  # warm-up, at both batch shapes the timed calls use
    plain_forward(model, xr, len(xr))
    vitlab.attention_rollout(model, xr)

    # --- distance
    t_fwd_d, _ = _timed(plain_forward, model, xd, batch)
    t_ours_d, ours_d = _timed(vitlab.mean_attention_distance, model, xd, batch_size=batch, progress=False)
    t_cap_d, maps = _timed(vitlab.attention_maps, model, xd, batch_size=batch)
    t_ours_d_step, step_d = _timed(attention_distance_from_maps, maps, info.grid_size, info.patch_size, p)
    t_loop_d_step, loop_d = _timed(distance_loops, maps, patch, p)
    np.testing.assert_allclose(loop_d, step_d.mean(1).numpy(), rtol=1e-4)  # the same numbers
    np.testing.assert_allclose(ours_d.numpy(), step_d.mean(1).numpy(), rtol=1e-4)
    del maps
    res["distance"] = {
        "forward_s": t_fwd_d, "ours_s": t_ours_d, "loop_s": t_cap_d + t_loop_d_step,
        "ours_step_s": t_ours_d_step, "loop_step_s": t_loop_d_step,
        "ours/forward": t_ours_d / t_fwd_d, "loop/ours": (t_cap_d + t_loop_d_step) / t_ours_d,
        "loop/ours step": t_loop_d_step / t_ours_d_step,
    }

    # --- rollout
    t_fwd_r, _ = _timed(plain_forward, model, xr, len(xr))
    t_ours_r, ours_r = _timed(vitlab.attention_rollout, model, xr)
    maps = vitlab.attention_maps(model, xr, batch_size=len(xr))
    v = readout_vector(info, len(xr))
    t_ours_r_step, step_r = _timed(rollout_row, maps, v, "mean", 0.0, 0.5, 0)
    t_loop_r_step, loop_step = _timed(rollout_loop_step, maps)
    del maps
    t_loop_r, loop_r = _timed(rollout_loop_end_to_end, model, xr)
    np.testing.assert_allclose(loop_r.numpy(), ours_r.flatten(1).numpy(), rtol=1e-3, atol=1e-6)
    np.testing.assert_allclose(loop_step.numpy(), step_r[:, p:].float().numpy(), rtol=1e-3, atol=1e-6)
    res["rollout"] = {
        "forward_s": t_fwd_r, "ours_s": t_ours_r, "loop_s": t_loop_r,
        "ours_step_s": t_ours_r_step, "loop_step_s": t_loop_r_step,
        "ours/forward": t_ours_r / t_fwd_r, "loop/ours": t_loop_r / t_ours_r,
        "loop/ours step": t_loop_r_step / t_ours_r_step,
    }
    return res


def format_table(res: dict) -> str:
    lines = [
        "| analysis | images | plain forward (s) | ours (s) | ours / forward | loop end to end (s) | loop / ours | "
        "analysis step: ours (s) | loop (s) | loop / ours |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for key, label in (("distance", "mean attention distance"), ("rollout", "attention rollout")):
        r = res[key]
        n = res["distance_images"] if key == "distance" else res["rollout_images"]
        lines.append(f"| {label} | {n} | {r['forward_s']:.1f} | {r['ours_s']:.1f} | **{r['ours/forward']:.2f}** | "
                     f"{r['loop_s']:.1f} | {r['loop/ours']:.1f} | {r['ours_step_s']:.3f} | {r['loop_step_s']:.2f} | "
                     f"**{r['loop/ours step']:.0f}** |")
    worst_f = max(res[k]["ours/forward"] for k in ("distance", "rollout"))
    worst_l = min(res[k]["loop/ours step"] for k in ("distance", "rollout"))
    lines += ["", f"Goal ours/forward <= {GOAL_FORWARD}: {'met' if worst_f <= GOAL_FORWARD else '**not met**'} "
              f"(worst {worst_f:.2f}). Goal loop/ours >= {GOAL_LOOP} on the analysis step: "
              f"{'met' if worst_l >= GOAL_LOOP else '**not met**'} (worst {worst_l:.0f})."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", default="vit_base_patch16_224")
    ap.add_argument("--distance-images", type=int, default=128)
    ap.add_argument("--rollout-images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)
    res = run(a.model, a.distance_images, a.rollout_images, a.batch)
    return report(res, format_table(res), a.json)


if __name__ == "__main__":
    raise SystemExit(main())
