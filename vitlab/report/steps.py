"""The report's steps, in the order ``vitlab reproduce`` runs them: one ``Step`` per section builder.

A new report section is a builder (``Context`` and a ``tick`` in, a ``Section``, a list of them or None out) and
one entry in ``STEPS``. ``Context`` carries what every builder may read: the model and its images (``Inputs``),
the prediction pass's results, the device and the options ``reproduce`` was called with.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from vitlab.base.provenance import versions
from vitlab.base.shipped import data_path
from vitlab.inspect import ATTRIBUTION_METHODS
from vitlab.models.load import SHAPES_CHECKPOINT
from vitlab.report import atlas as A
from vitlab.report import sections as S
from vitlab.report.recipes import recipes_sections
from vitlab.report.similarity import similarity as similarity_section

#: The shipped data-scaling sweep drawn in the report's scaling section.
SCALING_RESULTS = data_path("results/scaling_cifar10.jsonl")
#: The shipped training recipes (``vitlab export-recipe``): a folder per recipe, a checkpoint per seed.
RECIPES = data_path("checkpoints/recipes")

#: A step's progress callback: a part of the step begins, named in a few words.
Tick = Callable[[str], None]
Built = S.Section | list[S.Section] | None


@dataclass
class Context:
    """What every step reads: ``inp`` (the model and its images), ``pred`` (filled by the predictions step: the
    attention shape, predicted classes and probabilities), the ``device`` and ``reproduce``'s keyword ``options``."""

    inp: S.Inputs
    device: Any
    options: Mapping[str, Any]
    pred: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class Step:
    """One step: its ``name`` on the progress bar, its ``build``, how many ``parts`` it ticks through, and the
    ``reproduce`` keyword (``option``) that leaves it out when False (None: always runs)."""

    name: str
    build: Callable[[Context, Tick], Built]
    parts: int = 1
    option: str | None = None


def _predictions(ctx: Context, tick: Tick) -> None:
    ctx.pred.update(S.prediction_pass(ctx.inp))


def _localised(ctx: Context) -> bool:
    return bool(ctx.options.get("shapes")) and S.localisation_possible(SHAPES_CHECKPOINT)


STEPS: tuple[Step, ...] = (
    Step("predictions", _predictions),
    Step("filters", lambda ctx, tick: S.filters(ctx.inp)),
    Step("positions", lambda ctx, tick: S.positions(ctx.inp)),
    Step("distance", lambda ctx, tick: S.distance(ctx.inp, ctx.pred)),
    Step("maps", lambda ctx, tick: S.maps_and_faithfulness(ctx.inp, ctx.pred, localisation=_localised(ctx), tick=tick),
         parts=len(ATTRIBUTION_METHODS) + 1),
    Step("readout", lambda ctx, tick: S.readout_and_entropy(ctx.inp, ctx.pred)),
    Step("similarity", lambda ctx, tick: similarity_section(ctx.inp)),
    Step("heads", lambda ctx, tick: A.head_atlas(ctx.inp, ctx.pred)),
    Step("tokens", lambda ctx, tick: A.token_sections(ctx.inp, ctx.pred)),
    Step("localisation", lambda ctx, tick: S.localisation(SHAPES_CHECKPOINT, versions(), device=ctx.device, tick=tick),
         parts=len(ATTRIBUTION_METHODS) + 1, option="shapes"),
    Step("few-shot", lambda ctx, tick: S.few_shot(ctx.inp, tick=tick), parts=3, option="few_shot"),
    Step("scaling", lambda ctx, tick: S.scaling(SCALING_RESULTS, versions()), option="scaling"),
    Step("recipes", lambda ctx, tick: recipes_sections(RECIPES, ctx.device, tick), parts=2, option="recipes"),
)


def chosen(options: Mapping[str, Any], steps: tuple[Step, ...] = STEPS) -> list[Step]:
    """The steps that run under ``options``: those without an option, and those whose option is true."""
    return [s for s in steps if s.option is None or options.get(s.option)]
