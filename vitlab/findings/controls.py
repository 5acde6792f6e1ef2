"""Controls with a known answer for every finding's criterion (``vitlab.findings.model``).

A criterion is trusted only where it gives the known answer on cases built to have one. A *negative* control lacks
what the finding claims (a position table permuted across the grid has no 2D locality; a U-shaped distance profile
does not grow with depth) and must not be judged "reproduced"; a *positive* control has it by construction (a 2D
sin-cos table; a steady rise) and must be. Each control is built without training, from the model at hand (its own
tensors rearranged: its filters' variance spectrum, its position table permuted, its per-image and per-head
attention distances moved to a constructed profile) or from constructed weights (DCT bases, a sin-cos table, a map
equal to the object's mask), and judged by the same procedure as the model (``vitlab.findings.model.judge_filters``,
``judge_positions``, ``judge_distance``, ``rollout_localises``), conventions included.

The suite per finding (``CONTROLS``: key -> (control, kind)):

- ``fig7.left.low_frequency``: DCT bases with low frequencies first (positive); DCT bases with high frequencies
  first, white noise, random directions with the model's variance spectrum (negative).
- ``fig7.left.structured``: DCT bases, low or high frequencies first (positive: structure need not be
  low-frequency); white noise, random directions with the model's variance spectrum (negative).
- ``fig7.centre.distance``: a 2D sin-cos table, an isotropic table (positive); the model's table permuted across
  the grid (negative).
- ``fig7.centre.row_column``: a 2D sin-cos table (positive: its row and column halves make the stripes); an
  isotropic table, the model's table permuted (negative).
- ``fig7.right.lowest_spread``: a local and a global head at the paper's span (positive); all heads alike
  (negative), both with the model's own per-image and per-head variation.
- ``fig7.right.depth_trend``: a steady rise (positive); a U-shaped profile, a single jump at the last layer, a flat
  profile (negative), each with the model's own variation.
- ``fig6.rollout.localises``: a map equal to the object's mask (positive); a uniform map (negative).
- ``fig3_4.scaling.gap_narrows``: the sweep's records with the ViT raised by 20 points at the largest size
  (positive), and with the ViT gaining exactly what the ResNet gains (negative).
- ``fig3_4.locality`` (``study_findings.locality_key``): the sweep's records with the ViT's lowest-layer heads at
  the largest size set, seed by seed, to the smallest size's with their most global half made local (positive), and
  to another seed's at the smallest size (negative).
- ``raghu.uniformity``: the ViT with its layers shuffled (first, last, second, ...) against the ViT, a model whose
  every layer is the ViT's first against the ResNet (positive); the ViT against its shuffled copy (negative).
- ``raghu.lower_layers``: the ResNet against itself, the ViT against itself (positive: a model's lowest layers
  resemble its own lower half); the ResNet against itself with its layers in reverse order (negative).
- ``sec4_6.*`` (``study_findings.mpp_key``): the study's records with the initialisation expected ahead raised by 20
  points (positive), and with it equal to the other, seed by seed (negative).

``validate`` attaches a finding's results to its verdict (``vitlab.findings.verdict.validated``: a failed control makes a
"reproduced" inconclusive); ``validation_table`` lists them, finding by control, as the report writes them.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch

from vitlab.base.checks import check_seed
from vitlab.base.stats import Array, as_float64
from vitlab.findings import model as F
from vitlab.findings import similarity as SF
from vitlab.findings.studies import KEY_LOCALITY, KEY_SCALING
from vitlab.findings.verdict import Verdict, json_types, validated
from vitlab.inspect.distance import patch_distances
from vitlab.inspect.filters import dct_matrix

__all__ = ["ControlResult", "CONTROLS", "filter_controls", "position_controls", "distance_controls",
           "rollout_controls", "scaling_controls", "locality_controls", "locality_verdicts", "judge_study", "study_verdicts",
           "mpp_controls", "similarity_controls", "interleaved", "validate", "validation_table", "dct_filters",
           "sincos_similarity",
           "isotropic_similarity", "permuted_similarity", "NEGATIVE", "POSITIVE"]

NEGATIVE, POSITIVE = "negative", "positive"

DCT_LOW = "DCT bases, low frequencies first"
DCT_HIGH = "DCT bases, high frequencies first"
WHITE = "white-noise filters"
MATCHED = "random directions with the model's variance spectrum"
SINCOS = "2D sin-cos table"
ISOTROPIC = "isotropic table (similarity by Euclidean distance alone)"
PERMUTED = "the model's table permuted across the grid"
SPAN = "a local and a global head at the paper's span (0.1 and 0.9 of uniform)"
ALIKE = "all heads alike (at the model's lowest-layer mean)"
RISE = "a steady rise (0.1 to 0.9 of uniform)"
U_SHAPE = "a U-shaped profile"
JUMP = "a single jump at the last layer"
FLAT = "a flat profile"
MASK = "a map equal to the object's mask"
UNIFORM = "a uniform map"

#: every finding's controls, (name, kind), in the order the suite runs them
CONTROLS: dict[str, tuple[tuple[str, str], ...]] = {
    F.KEY_LOW_FREQUENCY: ((DCT_LOW, POSITIVE), (DCT_HIGH, NEGATIVE), (WHITE, NEGATIVE), (MATCHED, NEGATIVE)),
    F.KEY_STRUCTURED: ((DCT_LOW, POSITIVE), (DCT_HIGH, POSITIVE), (WHITE, NEGATIVE), (MATCHED, NEGATIVE)),
    F.KEY_POSITION_DISTANCE: ((SINCOS, POSITIVE), (ISOTROPIC, POSITIVE), (PERMUTED, NEGATIVE)),
    F.KEY_ROW_COLUMN: ((SINCOS, POSITIVE), (ISOTROPIC, NEGATIVE), (PERMUTED, NEGATIVE)),
    F.KEY_LOWEST_SPREAD: ((SPAN, POSITIVE), (ALIKE, NEGATIVE)),
    F.KEY_DEPTH_TREND: ((RISE, POSITIVE), (U_SHAPE, NEGATIVE), (JUMP, NEGATIVE), (FLAT, NEGATIVE)),
    F.KEY_ROLLOUT: ((MASK, POSITIVE), (UNIFORM, NEGATIVE)),
}


@dataclass(frozen=True)
class ControlResult:
    """A finding's criterion on one control: ``expected`` "reproduced" (a positive control) or "not reproduced"
    (a negative one, which any verdict but "reproduced" passes); ``observed`` the verdict it gave (with its
    qualifier), its ``statistic`` and ``interval``; ``passed`` whether that is the known answer."""

    key: str
    finding: str
    control: str
    kind: str
    expected: str
    observed: str
    statistic: float
    interval: tuple[float, float]
    passed: bool

    @classmethod
    def of(cls, control: str, kind: str, v: Verdict) -> ControlResult:
        if kind not in (NEGATIVE, POSITIVE):
            raise ValueError(f"kind must be {NEGATIVE!r} or {POSITIVE!r}, got {kind!r}")
        got = v.verdict == "reproduced"
        return cls(key=v.key, finding=v.finding, control=control, kind=kind,
                   expected="reproduced" if kind == POSITIVE else "not reproduced", observed=v.label,
                   statistic=v.statistic, interval=v.interval, passed=got == (kind == POSITIVE))

    def to_dict(self) -> dict:
        return json_types(asdict(self))


def _results(judged: Mapping[str, Sequence[Verdict]]) -> dict[str, list[ControlResult]]:
    """{control name: the verdicts judged on it} -> {finding key: its results, in ``CONTROLS`` order}."""
    by_key: dict[str, dict[str, Verdict]] = {}
    for control, verdicts in judged.items():
        for v in verdicts:
            by_key.setdefault(v.key, {})[control] = v
    return {key: [ControlResult.of(c, kind, by_key[key][c]) for c, kind in CONTROLS[key] if c in by_key[key]]
            for key in CONTROLS if key in by_key}


# ---------------------------------------------------------------------------------------------- Fig. 7 left


def dct_filters(shape: Sequence[int], order: str = "low", seed: int = 0) -> np.ndarray:
    """(D, C, P, Q) filters whose principal components are single-channel DCT basis functions in a known order:
    each filter a sum of every DCT basis (channel c, frequency (u, v)) with an independent normal coefficient whose
    standard deviation falls by 0.9 per place in the order: by DCT radius, lowest first (``order="low"``) or highest
    first (``"high"``), ties by channel."""
    d, c, p, q = (int(x) for x in shape)
    if order not in ("low", "high"):
        raise ValueError(f"order must be 'low' or 'high', got {order!r}")

    cells = [(math.hypot(u, v), ch, u, v) for ch in range(c) for u in range(p) for v in range(q)]
    cells.sort(key=lambda t: (t[0] if order == "low" else -t[0], t[1], t[2], t[3]))
    std = np.zeros((c, p, q))
    for rank, (_, ch, u, v) in enumerate(cells):
        std[ch, u, v] = 0.9**rank
    g = np.random.default_rng(check_seed("seed", seed))
    coef = g.standard_normal((d, c, p, q)) * std  # (D, C, P, Q) DCT coefficients
    return dct_matrix(p).T @ coef @ dct_matrix(q)  # inverse orthonormal DCT of each channel


def _matched_spectrum(w: np.ndarray, seed: int) -> np.ndarray:
    """(D, C, P, Q) normal filters with the principal variances of ``w`` along random orthonormal directions."""
    d = w.shape[0]
    flat = w.reshape(d, -1)
    s = np.linalg.svd(flat - flat.mean(0), compute_uv=False)  # (min(D, n),)
    g = np.random.default_rng(seed)
    basis = np.linalg.qr(g.standard_normal((flat.shape[1], len(s))))[0]  # (n, r) Haar
    return ((g.standard_normal((d, len(s))) * s / math.sqrt(max(d - 1, 1))) @ basis.T).reshape(w.shape)


def filter_controls(filters: Array, k: int = F.PAPER_COMPONENTS, seed: int = 0) -> dict[str, list[ControlResult]]:
    """The Fig. 7 left controls for (D, C, P, Q) patch-embedding filters (``vitlab.inspect.embedding_filters``):
    {finding key: results}, each judged by ``findings.judge_filters`` as the filters are."""
    w = as_float64(filters)
    if w.ndim != 4:
        raise ValueError(f"filters must be (D, C, P, Q), got shape {w.shape}")
    g = np.random.default_rng(check_seed("seed", seed))
    built = {DCT_LOW: dct_filters(w.shape, "low", seed), DCT_HIGH: dct_filters(w.shape, "high", seed),
             WHITE: g.standard_normal(w.shape) * float(w.std()), MATCHED: _matched_spectrum(w, seed)}
    return _results({name: F.judge_filters(x, k) for name, x in built.items()})


# ---------------------------------------------------------------------------------------------- Fig. 7 centre


def _cosine(table: np.ndarray) -> np.ndarray:
    flat = table.reshape(-1, table.shape[-1])
    flat = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
    return flat @ flat.T


def sincos_similarity(grid: tuple[int, int], dim: int) -> np.ndarray:
    """(N, N) cosine similarity of timm's fixed 2D sin-cos table (``build_sincos2d_pos_embed``) of width ``dim``
    (a multiple of 4) on a (gh, gw) grid, row-major: half its width encodes the row, half the column."""
    from timm.layers.pos_embed_sincos import build_sincos2d_pos_embed

    return _cosine(build_sincos2d_pos_embed(list(grid), dim=dim).double().numpy())


def isotropic_similarity(grid: tuple[int, int]) -> np.ndarray:
    """(N, N) similarity exp(-d / s) of grid distance d (s: half the longer side): 2D-local and the same in every
    direction, so with no row/column structure (a positive-definite kernel, as a table's cosine similarity is)."""
    d = patch_distances(grid, (1, 1)).numpy()
    return np.exp(-d / (max(grid) / 2))


def permuted_similarity(table: Array, seed: int = 0) -> np.ndarray:
    """(N, N) cosine similarity of a (gh, gw, D) position table whose rows are permuted across the grid (a
    permutation drawn from ``seed``): the same embeddings with no 2D layout."""
    t = as_float64(table)
    flat = t.reshape(-1, t.shape[-1])
    perm = np.random.default_rng(check_seed("seed", seed)).permutation(len(flat))
    return _cosine(flat[perm])


def position_controls(table: Array, seed: int = 0) -> dict[str, list[ControlResult]]:
    """The Fig. 7 centre controls for a (gh, gw, D) position table (``vitlab.inspect.position_table``), judged by
    ``findings.judge_positions`` on the table's grid."""
    t = as_float64(table)
    if t.ndim != 3:
        raise ValueError(f"table must be (gh, gw, D), got shape {t.shape}")
    grid = (t.shape[0], t.shape[1])
    dim = 4 * max(1, t.shape[2] // 4)  # the sin-cos table needs a multiple of 4
    built = {SINCOS: sincos_similarity(grid, dim), ISOTROPIC: isotropic_similarity(grid),
             PERMUTED: permuted_similarity(t, seed)}
    return _results({name: F.judge_positions(sim, grid) for name, sim in built.items()})


# ---------------------------------------------------------------------------------------------- Fig. 7 right


def _profiles(layers: int) -> dict[str, np.ndarray]:
    """The depth controls' layer profiles in units of the uniform distance, (L,) each."""
    x = np.arange(layers) - (layers - 1) / 2
    u = 0.2 + 0.6 * (x / max(abs(x).max(), 1e-9)) ** 2  # 0.8 at both ends, 0.2 in the middle
    jump = np.full(layers, 0.3)
    jump[-1] = 0.8
    return {RISE: np.linspace(0.1, 0.9, layers), U_SHAPE: u, JUMP: jump, FLAT: np.full(layers, 0.5)}


def distance_controls(dist: Array, ceiling: float) -> dict[str, list[ControlResult]]:
    """The Fig. 7 right controls for (L, B, H) per-image attention distances (as ``lowest_layer_spread`` takes them)
    with the uniform-attention ``ceiling`` in their unit: each keeps the model's own variation over images and heads
    (every distance minus its layer's mean) about a constructed layer profile or lowest-layer heads, judged by
    ``findings.judge_distance`` in that one unit."""
    d = as_float64(dist)
    if d.ndim != 3:
        raise ValueError(f"dist must be (L, B, H), got shape {d.shape}")
    L, _, h = d.shape
    rest = d - d.mean((1, 2), keepdims=True)  # (L, B, H) the model's variation about each layer's mean
    name = "control"
    judged: dict[str, list[Verdict]] = {}
    for control, profile in _profiles(L).items():
        if L >= 2:
            built = ceiling * profile[:, None, None] + rest
            judged[control] = [v for v in F.judge_distance({name: built}, {name: ceiling})
                               if v.key == F.KEY_DEPTH_TREND]
    local_global = np.where(np.arange(h) < h / 2, 0.1, 0.9) if h >= 2 else np.array([0.5])
    d0 = rest[:1] - rest[:1].mean(1, keepdims=True)  # (1, B, H) per-image variation, each head about its own mean
    for control, heads in ((SPAN, local_global), (ALIKE, np.full(h, d[0].mean() / ceiling))):
        judged[control] = [F.judge_distance({name: ceiling * heads[None, None] + d0}, {name: ceiling})[0]]
    return _results(judged)


# ---------------------------------------------------------------------------------------------- Fig. 6


def rollout_controls(masks: torch.Tensor, grid: tuple[int, int], random_mass: Array,
                     random_pointing: Array) -> dict[str, list[ControlResult]]:
    """The Fig. 6 controls on the images whose object ``masks`` (B, H, W) are known, against the random map's
    scores on them (``localisation(maps["random map"], masks)``): a map equal to the mask pooled onto the (gh, gw)
    grid, and a uniform map, each scored by ``vitlab.inspect.localisation`` and judged by ``rollout_localises``."""
    from vitlab.inspect import localisation

    b = masks.shape[0]
    gh, gw = grid
    frac = torch.nn.functional.avg_pool2d(masks[:, None].double(), (masks.shape[1] // gh, masks.shape[2] // gw))[:, 0]
    judged = {}
    for control, maps in ((MASK, frac), (UNIFORM, torch.ones(b, gh, gw, dtype=torch.float64))):
        s = localisation(maps, masks)
        judged[control] = [F.rollout_localises(s["mass_in_mask"], s["pointing"], random_mass, random_pointing)]
    return _results(judged)


# ---------------------------------------------------------------------------------------------- verdicts


def validate(verdicts: Iterable[Verdict], results: Mapping[str, Sequence[ControlResult]]) -> list[Verdict]:
    """``verdicts`` each with its finding's control ``results`` (``vitlab.findings.verdict.validated``); a verdict whose
    finding has no results here is returned as it is."""
    return [validated(v, [r.to_dict() for r in results[v.key]]) if v.key in results else v for v in verdicts]


def validation_table(verdicts: Iterable[Verdict]) -> list[dict]:
    """The criterion-validation table: one row per finding and control, {"key", "finding", "control", "kind",
    "expected", "observed", "statistic", "interval", "passed"}, from the verdicts' ``controls``."""
    return [{"key": v.key, "finding": v.finding, **{k: c.get(k) for k in ("control", "kind", "expected", "observed",
                                                                          "statistic", "interval", "passed")}}
            for v in verdicts for c in v.controls]


# ---------------------------------------------------------------------------------------------- Fig. 3/4


#: the gain, in accuracy points, the Fig. 3/4 positive control adds to the ViT at the largest size
SCALING_GAIN = 20.0
EQUAL_GAINS = "the ViT gains what the ResNet gains"
LARGE_GAIN = f"the ViT gains {SCALING_GAIN:g} points more at the largest size"
CONTROLS[KEY_SCALING] = ((LARGE_GAIN, POSITIVE), (EQUAL_GAINS, NEGATIVE))


def _rewritten_runs(records: Sequence[Mapping], family: str, edit: Callable[[dict, dict], None]) -> list[dict]:
    """A deep copy of the sweep's ``records`` in which ``edit(spec, metrics)`` rewrote, in place, the copy of each
    finished ("ok") run of ``family`` (its spec and its metrics, {} where it has none); the other records as they
    were. How the Fig. 3/4 and locality controls make sweeps with a known answer."""
    import copy

    out = []
    for r in records:
        r = copy.deepcopy(dict(r))
        spec = r.get("spec") or {}
        if spec.get("family") == family and r.get("status") == "ok":
            edit(spec, r.get("metrics") or {})
        out.append(r)
    return out


def scaling_controls(records: Sequence[Mapping], shots: int = 10, vit: str = "vit",
                     resnet: str = "bit") -> dict[str, list[ControlResult]]:
    """The Fig. 3/4 controls from the sweep's own records (``study_findings.scaling_gap_narrows`` takes them): the
    ViT's runs rewritten to gain exactly what the ResNet's gain from the smallest size on, seed by seed (negative),
    and raised by ``SCALING_GAIN`` points at the largest size (positive: a large gain must be seen over these
    seeds' spread)."""
    from vitlab.findings.studies import POINTS, scaling_accuracies, scaling_gap_narrows

    acc = scaling_accuracies(records, shots)
    sizes = sorted({n for f, n, _ in acc if f == vit} & {n for f, n, _ in acc if f == resnet})
    if len(sizes) < 2:
        return {}
    lo, hi = sizes[0], sizes[-1]

    def rewritten(value) -> list[dict]:
        def edit(spec: dict, metrics: dict) -> None:
            few = (metrics.get("few_shot") or {}).get(str(shots))
            if isinstance(few, dict):
                new = value(int(spec["size"]), int(spec["seed"]), float(few["mean"]))
                if new is not None:
                    few["mean"] = new
        return _rewritten_runs(records, vit, edit)

    def equal(n: int, s: int, a: float) -> float | None:
        if not all(k in acc for k in ((resnet, n, s), (vit, lo, s), (resnet, lo, s))):
            return None
        return acc[resnet, n, s] + acc[vit, lo, s] - acc[resnet, lo, s]

    built = {LARGE_GAIN: rewritten(lambda n, s, a: a + SCALING_GAIN / POINTS if n == hi else None),
             EQUAL_GAINS: rewritten(equal)}
    return _results({name: [scaling_gap_narrows(rs, shots, vit, resnet)] for name, rs in built.items()})


# ---------------------------------------------------------------------------------------------- locality


#: where the locality positive control moves the most global half of the lowest layer's heads: a local head at the
#: paper's span (Fig. 7 right: about 0.1 of the uniform-attention distance, ``SPAN``)
LOCAL_AT = 0.1
MORE_LOCAL = (f"the smallest size's heads at the largest, their most global half moved to {LOCAL_AT:g} of uniform, "
              "seed by seed")
SAME_LOCAL = "another seed's smallest-size heads at the largest size (no change, the seeds' own spread)"
CONTROLS[KEY_LOCALITY] = ((MORE_LOCAL, POSITIVE), (SAME_LOCAL, NEGATIVE))


def _half_local(heads: Sequence[float]) -> list[float]:
    """``heads`` (H,) distances with the ceil(H / 2) largest moved to ``LOCAL_AT`` (ties: the later heads)."""
    order = sorted(range(len(heads)), key=lambda h: (heads[h], h))
    moved = set(order[len(heads) // 2:])
    return [LOCAL_AT if h in moved else float(d) for h, d in enumerate(heads)]


def locality_controls(records: Sequence[Mapping], family: str = "vit") -> dict[str, list[ControlResult]]:
    """The locality finding's controls (``study_findings.locality_grows_with_data`` with the same ``family``) from
    the sweep's own records, each rewriting the lowest layer's heads (``lowest_heads``, and the share and extremes
    made from them) of ``family``'s runs at the largest size, seed by seed: to the smallest size's heads of the next
    seed in order (negative: no change with data, the seeds' own spread; the mean change is 0), and to the smallest
    size's heads of the same seed with their most global half moved to ``LOCAL_AT`` of uniform (positive: local heads
    that more data made must be seen). Seeds without both runs keep their records. {} when the records hold Fig. 7
    statistics at fewer than 2 sizes."""
    from vitlab.findings.studies import fig7_by_run, locality_grows_with_data
    from vitlab.train.emergence import lowest_layer

    stats = fig7_by_run(records, family)
    sizes = sorted({n for n, _ in stats})
    if len(sizes) < 2:
        return {}
    lo, hi = sizes[0], sizes[-1]
    seeds = sorted(s for n, s in stats if n == lo and (hi, s) in stats)
    other = dict(zip(seeds, seeds[1:] + seeds[:1]))

    def rewritten(heads_of) -> list[dict]:
        def edit(spec: dict, metrics: dict) -> None:
            fig7, s = metrics.get("fig7"), int(spec["seed"])
            if isinstance(fig7, dict) and int(spec["size"]) == hi and s in other:
                fig7.update(lowest_layer(heads_of(s)))
        return _rewritten_runs(records, family, edit)

    built = {MORE_LOCAL: rewritten(lambda s: _half_local(stats[lo, s]["lowest_heads"])),
             SAME_LOCAL: rewritten(lambda s: [float(d) for d in stats[lo, other[s]]["lowest_heads"]])}
    results = [ControlResult.of(name, kind, locality_grows_with_data(built[name], family))
               for name, kind in CONTROLS[KEY_LOCALITY]]
    return {results[0].key: results}


def locality_verdicts(records: Sequence[Mapping], families: Sequence[str] = ("vit", "hybrid")) -> list[Verdict]:
    """The locality verdict (``study_findings.locality_grows_with_data``) of each of ``families`` whose runs in
    ``records`` hold Fig. 7 statistics at 2 or more sizes, each validated with its controls (``locality_controls``);
    none for a sweep from before runs recorded them."""
    from vitlab.findings.studies import fig7_by_run, locality_grows_with_data

    out = []
    for fam in families:
        if len({n for n, _ in fig7_by_run(records, fam)}) >= 2:
            out += validate([locality_grows_with_data(records, fam)], locality_controls(records, fam))
    return out


def judge_study(records: Sequence[Mapping], shots: int = 10, vit: str = "vit",
                resnet: str = "bit") -> tuple[list[Verdict], str]:
    """A data-scaling study's verdicts, each validated with its controls, and why the gap was not judged: the Fig.
    3/4 gap change (``study_findings.scaling_gap_narrows`` with ``scaling_controls``) where ``records`` hold finished
    runs of both ``vit`` and ``resnet``, then the locality verdicts of ``vit`` and the hybrid (``locality_verdicts``).
    ``why``: "" when the gap was judged or a family is missing, else the ValueError ``scaling_gap_narrows`` raised
    (the two families at fewer than 2 common sizes); the locality verdicts come either way."""
    from vitlab.findings.studies import scaling_gap_narrows

    families = {r["spec"]["family"] for r in records if r.get("status") == "ok"}
    gap, why = [], ""
    if {vit, resnet} <= families:
        try:
            gap = validate([scaling_gap_narrows(records, shots, vit, resnet)],
                           scaling_controls(records, shots, vit, resnet))
        except ValueError as e:
            why = str(e)
    return gap + locality_verdicts(records, (vit, "hybrid")), why


def study_verdicts(records: Sequence[Mapping], shots: int = 10, vit: str = "vit", resnet: str = "bit") -> list[Verdict]:
    """``judge_study``'s verdicts. Raises ValueError with its ``why`` where the gap could not be judged."""
    verdicts, why = judge_study(records, shots, vit, resnet)
    if why:
        raise ValueError(why)
    return verdicts

# ---------------------------------------------------------------------------------------------- Sec. 4.6


#: the gain, in accuracy points, the Sec. 4.6 positive control adds to the initialisation expected ahead
MPP_GAIN = 20.0
LEVEL = "the two initialisations equal, seed by seed"
AHEAD = f"the one expected ahead raised by {MPP_GAIN:g} points"


def mpp_controls(records: Sequence[Mapping], better: str = "mpp", worse: str = "scratch", kind: str = "few_shot",
                 shots: int = 10, readout: str = "model") -> dict[str, list[ControlResult]]:
    """The controls of one Sec. 4.6 comparison (``study_findings.mpp_ordering`` with the same arguments), from the
    study's own records: ``better``'s accuracies replaced by ``worse``'s on the same seeds (negative: equal, so not
    ahead), and ``better``'s raised by ``MPP_GAIN`` points on every seed (positive: a large lead must be seen over
    these seeds' spread)."""
    import copy

    from vitlab.findings.studies import POINTS, mpp_accuracies, mpp_ordering
    from vitlab.studies.mpp import few_shot_key

    acc = mpp_accuracies(records, kind, shots, readout)
    if better not in acc or worse not in acc:
        return {}

    def rewritten(value) -> list[dict]:
        out = []
        for r in records:
            r = copy.deepcopy(dict(r))
            if r.get("init") == better and r.get("kind") == kind and r.get("status") == "ok":
                if kind == "few_shot":
                    cell = (r.get("metrics") or {}).get(few_shot_key(readout), {}).get(str(shots))
                    if cell is not None:
                        cell["per_seed"] = [value(int(s), float(a))
                                            for s, a in zip(r["spec"]["probe_seeds"], cell["per_seed"])]
                else:
                    r["metrics"]["test_accuracy"] = value(int(r["seed"]), float(r["metrics"]["test_accuracy"]))
            out.append(r)
        return out

    built = {AHEAD: rewritten(lambda s, a: a + MPP_GAIN / POINTS),
             LEVEL: rewritten(lambda s, a: acc[worse].get(s, a))}
    key = None
    results = []
    for name, kind_ in ((AHEAD, POSITIVE), (LEVEL, NEGATIVE)):
        v = mpp_ordering(built[name], better, worse, kind=kind, shots=shots, readout=readout)
        key = v.key
        results.append(ControlResult.of(name, kind_, v))
    return {key: results}


# ---------------------------------------------------------------------------------------------- Raghu et al. 2021


SHUFFLED_VS_VIT = "the ViT with its layers shuffled (first, last, second, ...) against the ViT"
VIT_VS_SHUFFLED = "the ViT against itself with its layers shuffled (first, last, second, ...)"
ALL_FIRST = "a model whose every layer is the ViT's first, against the ResNet"
RESNET_SELF = "the ResNet against itself"
VIT_SELF = "the ViT against itself"
RESNET_REVERSED = "the ResNet against itself with its layers in reverse order"
CONTROLS[SF.KEY_UNIFORMITY] = ((SHUFFLED_VS_VIT, POSITIVE), (ALL_FIRST, POSITIVE), (VIT_VS_SHUFFLED, NEGATIVE))
CONTROLS[SF.KEY_LOWER_LAYERS] = ((RESNET_SELF, POSITIVE), (VIT_SELF, POSITIVE), (RESNET_REVERSED, NEGATIVE))


def interleaved(layers: int) -> list[int]:
    """``layers`` layers shuffled so that every half holds low and high ones: first, last, second, second to last,
    ... ([0, 6, 1, 5, 2, 4, 3] for 7)."""
    return [i // 2 if i % 2 == 0 else layers - 1 - i // 2 for i in range(layers)]


def similarity_controls(tables) -> dict[str, list[ControlResult]]:
    """The Raghu et al. controls from the ViT-against-ResNet ``vitlab.inspect.cka.SimilarityTables`` themselves (the
    same images, batches and jackknife), judged by ``similarity_findings.uniformity`` and ``lower_layers``:

    - uniformity: a copy whose layers are shuffled across depth (``interleaved``) has its low and high layers in
      both halves, so a model whose similarity falls with the distance between layers is less uniform than that
      copy (the shuffled copy against the model: positive; the model against it: negative); a model whose layers
      are all the same representation is perfectly uniform (against the ResNet: positive).
    - lower layers: a model's lowest layers resemble its own lower half, which holds them (CKA 1), more than its
      upper half (a model against itself: positive); against itself in reverse order they resemble the copy's
      upper half (negative).
    """
    la, lb = tables.aa.shape[-1], tables.bb.shape[-1]
    vit = tables.self_pair("a")
    resnet = tables.self_pair("b")
    judged = {SHUFFLED_VS_VIT: [SF.uniformity(vit.reordered(a=interleaved(la)))],
              VIT_VS_SHUFFLED: [SF.uniformity(vit.reordered(b=interleaved(la)))],
              ALL_FIRST: [SF.uniformity(tables.reordered(a=[0] * la))],
              RESNET_SELF: [SF.lower_layers(resnet)], VIT_SELF: [SF.lower_layers(vit)],
              RESNET_REVERSED: [SF.lower_layers(resnet.reordered(b=list(range(lb))[::-1]))]}
    return _results(judged)
