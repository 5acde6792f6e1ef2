"""``vitlab info``: what vitlab knows about a model (its token grid, prefix tokens, readout, card)."""

from __future__ import annotations

import argparse
import dataclasses
import json

from vitlab.cli.args import add_model_arguments, positive_int

NAME = 'info'
HELP = 'print what vitlab knows about a model (grid, prefix tokens, readout, ...)'


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_model_arguments(parser)
    parser.add_argument("--json", action="store_true", help="machine-readable output")
    parser.add_argument("--img-size", type=positive_int, nargs=2, metavar=("H", "W"), help="input size to describe")


def run(args: argparse.Namespace) -> int:
    from vitlab.models.card import weights_description
    from vitlab.models.checkpoint import card_line, card_metric, model_card
    from vitlab.models.info import model_info
    from vitlab.models.load import load_model

    model = load_model(args.model, pretrained=args.pretrained, weights=args.weights)
    params = sum(p.numel() for p in model.parameters())
    card = model_card(model)
    source = weights_description(model, args.model, args.pretrained, args.weights)  # as the report words it
    try:
        info = model_info(model, img_size=tuple(args.img_size) if args.img_size else None)
    except TypeError:  # a CNN: no tokens to describe
        if args.img_size:  # not left out without a word
            raise ValueError(f"--img-size gives a ViT's token grid at another input size; {args.model} is a "
                             f"{type(model).__name__}, which has no tokens: leave --img-size out") from None
        info = None
    d = dataclasses.asdict(info) if info is not None else {"architecture": type(model).__name__}
    if info is not None:
        d.update(num_tokens=info.num_tokens, prefix_kinds=list(info.prefix_kinds))
    d.update(parameters=params, weights=source, checkpoint=getattr(model, "vitlab_checkpoint", {}).get("path"),
             card_accuracy=card.get("test_accuracy") if card else None,
             card_metric=card_metric(card) if card else None)
    if args.json:
        print(json.dumps(d, indent=2))
        return 0
    from vitlab.models.info import architecture_words

    arch = architecture_words(model, info) if info is not None else d["architecture"]  # as the report's facts
    rows = [("model", args.model or "embedded default"), ("architecture", arch),
            ("parameters", f"{params:,}"), ("weights", source)]
    if card:
        rows.append(("model card", card_line(card)))
    if info is not None:
        rows += [("input", f"{info.img_size[0]}x{info.img_size[1]} px, {info.patch_size[0]}x{info.patch_size[1]} "
                           f"px patches, grid {info.grid_size[0]}x{info.grid_size[1]}"),
                 ("tokens", f"{info.num_tokens} ({info.num_prefix_tokens} prefix: "
                            f"{', '.join(info.prefix_kinds) or 'none'}"
                            + (f", joins at block {info.class_token_joins + 1}" if info.class_token_joins else "")
                            + ")"),
                 ("blocks", f"{info.depth} x width {info.embed_dim}, {info.num_heads} heads"),
                 ("position embedding", f"{info.pos_embed} (prefix rows: {'yes' if info.pos_embed_has_prefix else 'no'})"
                                        + (f"; in attention: {', '.join(info.attention_positions)}"
                                           if info.attention_positions else "")
                                        + (f" (blocks 1-{info.gpsa_depth})" if info.gpsa_depth else "")),  # ConViT
                 ("readout", info.readout + (" (hybrid: CNN features as patches)" if info.hybrid else ""))]
    width = max(len(k) for k, _ in rows)
    print("\n".join(f"{k.ljust(width)}  {v}" for k, v in rows))
    return 0
