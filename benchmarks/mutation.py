"""A fixed list of small mutants of the analysis modules, each run against its targeted tests in a temporary copy.

    python -m benchmarks.mutation                   # every mutant; writes benchmarks/results/mutation.json
    python -m benchmarks.mutation --check           # only checks that every mutant applies (no tests run)
    python -m benchmarks.mutation --only rollout    # the mutants whose name contains "rollout"

A mutant is one textual edit (a comparison flipped, a term dropped, an off-by-one, a constant changed) of one
module: ``old`` must occur exactly once in the file, so a mutant that no longer applies is reported, never silently
skipped. The checkout's files (tracked and new ones, as ``git ls-files`` lists them) are copied to a temporary
folder once; each mutant is written into that copy, its tests run there (``PYTHONPATH`` the copy, no bytecode
written, so no stale ``.pyc`` of another mutant is read), and the file is restored. The checkout itself is never
edited. A mutant is *killed* when its tests fail (or error, or time out) and *survives* when they pass; the tests
are first run once unmutated, and a selection that fails there stops the run (a kill would mean nothing).

A module moved into a sub-package is found by its file name under ``vitlab/`` (the snippet decides between
namesakes), so the list survives the package's reorganisation.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "results" / "mutation.json"


@dataclass(frozen=True)
class Mutant:
    """``old`` -> ``new`` in ``path`` (relative to the checkout), judged by ``tests`` (pytest arguments)."""

    name: str
    path: str
    old: str
    new: str
    tests: tuple[str, ...]


def _m(name: str, path: str, old: str, new: str, *tests: str) -> Mutant:
    return Mutant(name, path, old, new, tests)


STATS = ("tests/test_inspect.py", "-k", "spearman or rank or ranks")
CELLS = ("tests/test_scaling.py", "tests/test_widgets.py", "-k", "cell or percent or probability or words")
VERDICT = ("tests/test_findings.py", "tests/test_controls.py")
FINDINGS = ("tests/test_findings.py",)
INSPECT = ("tests/test_inspect.py",)
CAPTURE = ("tests/test_capture.py", "tests/test_inspect.py")
FAITH = ("tests/test_attribution.py",)

MUTANTS: tuple[Mutant, ...] = (
    # vitlab/base/stats.py
    _m("stats.spearman.no_centring", "vitlab/base/stats.py",
       "ra, rb = ra - ra.mean(1, keepdim=True), rb - rb.mean(1, keepdim=True)", "ra, rb = ra, rb - rb.mean(1, keepdim=True)",
       *STATS),
    _m("stats.average_ranks.tie_mean", "vitlab/base/stats.py", "index_add_(0, inv, r[i]) / counts",
       "index_add_(0, inv, r[i]) / (counts + 1)", *STATS),
    _m("stats.spearman.nan_second_input", "vitlab/base/stats.py", "a.double().isnan().any(1) | b.double().isnan().any(1)",
       "a.double().isnan().any(1)", *STATS),
    _m("stats.percent_cell.ddof", "vitlab/base/stats.py", "/ (n - 1)) if n > 1", "/ n) if n > 1", *CELLS),
    _m("stats.probability_words.boundary", "vitlab/base/stats.py", 'return f"{p:.1%}" if p >= 0.00095',
       'return f"{p:.1%}" if p >= 0.001', *CELLS),
    # vitlab/findings/verdict.py
    _m("verdict.decide.touching", "vitlab/findings/verdict.py", "above, below = lo > threshold, hi < threshold",
       "above, below = lo >= threshold, hi <= threshold", *VERDICT),
    _m("verdict.decide.side_lt_swapped", "vitlab/findings/verdict.py",
       'return "reproduced" if below else "not reproduced" if above else "inconclusive"',
       'return "reproduced" if above else "not reproduced" if below else "inconclusive"', *VERDICT),
    _m("verdict.mean_interval.t_df", "vitlab/findings/verdict.py",
       "half = float(t.ppf(0.975, n - 1)) * values.std(ddof=1) / math.sqrt(n)",
       "half = float(t.ppf(0.975, n)) * values.std(ddof=1) / math.sqrt(n)", *VERDICT),
    _m("verdict.mean_interval.bootstrap_from", "vitlab/findings/verdict.py", "    if n < MIN_MEAN_BOOTSTRAP:",
       "    if n < MIN_MEAN_BOOTSTRAP // 2:", *VERDICT),
    _m("verdict.percentile_interval.level", "vitlab/findings/verdict.py",
       "    a = (1 - LEVEL) / 2\n    return float(np.quantile(s, a))",
       "    a = (1 - LEVEL)\n    return float(np.quantile(s, a))", *VERDICT),
    _m("verdict.prediction_interval.one_more", "vitlab/findings/verdict.py", "values.std(ddof=1) * math.sqrt(1 + 1 / n)",
       "values.std(ddof=1) * math.sqrt(1 / n)", *VERDICT),
    _m("verdict.prediction_interval.rank", "vitlab/findings/verdict.py", "i, j = math.floor(a * (n + 1) + 1e-9)",
       "i, j = math.floor(a * n + 1e-9)", *VERDICT),
    _m("verdict.weighted_ranks.mid", "vitlab/findings/verdict.py", "- total + (total + 1) / 2", "- total + total / 2",
       *VERDICT),
    _m("verdict.validated.keeps_reproduced", "vitlab/findings/verdict.py",
       'verdict="inconclusive" if v.verdict == "reproduced" else v.verdict', "verdict=v.verdict", *VERDICT),
    _m("verdict.no_spread.resolution", "vitlab/findings/verdict.py", "sd < resolution[0]:", "sd < resolution[0] / 10:",
       *VERDICT),
    _m("verdict.across_conventions.agree", "vitlab/findings/verdict.py", "if len({v.verdict for v in verdicts.values()}) == 1:",
       "if len({v.verdict for v in verdicts.values()}) >= 1:", *VERDICT),
    # vitlab/findings/model.py
    _m("findings.dct.half_sample", "vitlab/inspect/filters.py", "np.cos(np.pi * (2 * i + 1) * k / (2 * n))",
       "np.cos(np.pi * (2 * i) * k / (2 * n))", *FINDINGS),
    _m("findings.filters.rank_plus_one", "vitlab/findings/model.py", "(radius < radius[0]).sum() + 1)",
       "(radius < radius[0]).sum())", *FINDINGS),
    _m("findings.structure.unnormalised_weights", "vitlab/findings/model.py", "w = er[:k] / er[:k].sum()", "w = er[:k]",
       *FINDINGS),
    _m("findings.lowest_spread.no_min", "vitlab/findings/model.py", "return (heads.max(1) - heads.min(1)) / ceiling",
       "return heads.max(1) / ceiling", *FINDINGS),
    _m("findings.lowest_spread.threshold", "vitlab/findings/model.py",
       "LOWEST_SPREAD_THRESHOLD = PAPER_LOWEST_SPREAD / 2", "LOWEST_SPREAD_THRESHOLD = PAPER_LOWEST_SPREAD / 4",
       *FINDINGS),
    _m("findings.depth_trend.flipped", "vitlab/findings/model.py", "stat = float((np.diff(profile) > tol).mean())",
       "stat = float((np.diff(profile) < tol).mean())", *FINDINGS),
    _m("findings.distance_shift.sign", "vitlab/findings/model.py", "diff = da.mean(-1) - db.mean(-1)",
       "diff = db.mean(-1) - da.mean(-1)", *FINDINGS),
    _m("findings.distance_shift.lower_end", "vitlab/findings/model.py", '"a < b" if hi < 0 else', '"a < b" if lo < 0 else',
       *FINDINGS),
    # vitlab/inspect/capture.py
    _m("capture.fuse.max_is_min", "vitlab/inspect/capture.py", "return attn.amax(dim=dim, keepdim=keepdim)",
       "return attn.amin(dim=dim, keepdim=keepdim)", *CAPTURE),
    _m("capture.class_token_diagonal", "vitlab/inspect/capture.py", "    out[..., 0, 0] = diagonal", "    out[..., 0, 0] = 0.0",
       *CAPTURE),
    _m("capture.negative_layer", "vitlab/inspect/capture.py", "j = i + depth if i < 0 else i", "j = i + depth - 1 if i < 0 else i",
       *CAPTURE),
    _m("capture.prefix_queries", "vitlab/inspect/capture.py", "attn = attn[..., : self.num_prefix_tokens, :]",
       "attn = attn[..., : self.num_prefix_tokens + 1, :]", *CAPTURE),
    # vitlab/inspect/distance.py
    _m("distance.one_axis", "vitlab/inspect/distance.py", "(xs[:, None] - xs[None]) ** 2)",
       "(xs[:, None] - xs[None]).abs())", "tests/test_inspect.py", "tests/test_emergence.py"),
    _m("distance.renormalize_dropped", "vitlab/inspect/distance.py",
       "a = a / a.sum(-1, keepdim=True).clamp_min(1e-12)", "a = a", "tests/test_inspect.py"),
    _m("distance.mean_over_queries", "vitlab/inspect/distance.py", ".view(maps.shape[:-2]) / n",
       ".view(maps.shape[:-2]) / (n - 1)", "tests/test_inspect.py"),
    # vitlab/inspect/positions.py
    _m("positions.prefix_rows_kept", "vitlab/inspect/positions.py",
       "n_prefix = info.num_prefix_tokens if info.pos_embed_has_prefix else 0", "n_prefix = 0",
       "tests/test_inspect.py", "tests/test_finetune.py"),
    _m("positions.pairs_with_diagonal", "vitlab/inspect/positions.py", "offset=1)", "offset=0)",
       "tests/test_inspect.py", "tests/test_finetune.py"),
    # vitlab/inspect/filters.py
    _m("filters.no_mean_centring", "vitlab/inspect/filters.py", "    x = x - x.mean(0, keepdim=True)\n", "",
       *INSPECT),
    _m("filters.linear_layout", "vitlab/inspect/filters.py", ".reshape(d, ph, pw, c).permute(0, 3, 1, 2)",
       ".reshape(d, c, ph, pw)", *INSPECT),
    _m("filters.no_sign_convention", "vitlab/inspect/filters.py", "comps = comps * signs", "comps = comps", *INSPECT),
    _m("filters.variance_is_s", "vitlab/inspect/filters.py", "var = s**2", "var = s", *INSPECT),
    # vitlab/inspect/rollout.py
    _m("rollout.no_attention_weight", "vitlab/inspect/rollout.py", "a = (1 - residual) * a", "a = a", *INSPECT),
    _m("rollout.discard_keeps_00", "vitlab/inspect/rollout.py", "weakest[:, 0] = False", "weakest[:, 1] = False",
       *INSPECT),
    _m("rollout.order_of_product", "vitlab/inspect/rollout.py",
       "joint = _layer_matrix(maps[layer], head_fusion, discard_ratio, residual) @ joint",
       "joint = joint @ _layer_matrix(maps[layer], head_fusion, discard_ratio, residual)", *INSPECT),
    _m("rollout.distillation_half", "vitlab/inspect/rollout.py",
       "= 1.0 / (info.num_class_tokens + info.num_dist_tokens)", "= 1.0", *INSPECT),
    _m("rollout.late_discard_count", "vitlab/inspect/rollout.py",
       "k = int((T - 1) ** 2 * discard_ratio) if late else", "k = int(T * T * discard_ratio) if late else", *INSPECT),
    _m("rollout.readout_heads_mean", "vitlab/inspect/rollout.py",
       'rows = torch.einsum("t,lbhts->lbs", v, maps) / maps.shape[2]',
       'rows = torch.einsum("t,lbhts->lbs", v, maps) / maps.shape[1]', *INSPECT),
    # vitlab/inspect/cka.py
    _m("cka.ucentre_total_dropped", "vitlab/inspect/cka.py", " + total / ((n - 1) * (n - 2))", "", "tests/test_cka.py"),
    _m("cka.hsic_scale", "vitlab/inspect/cka.py", "return u / math.sqrt(n * (n - 3))",
       "return u / math.sqrt(n * (n - 2))", "tests/test_cka.py"),
    _m("cka.biased_scale", "vitlab/inspect/cka.py", "return k / (n - 1)", "return k / n", "tests/test_cka.py"),
    _m("cka.last_batch_only", "vitlab/inspect/cka.py", "self.cross += ga @ gb.T", "self.cross = ga @ gb.T",
       "tests/test_cka.py"),
    # vitlab/inspect/heads.py
    _m("heads.slice_off_by_one", "vitlab/inspect/heads.py", "cols = slice(head * width, (head + 1) * width)",
       "cols = slice(head * width, (head + 1) * width - 1)", "tests/test_heads.py"),
    _m("heads.logits_not_logprob", "vitlab/inspect/heads.py", "lp = logits.double().log_softmax(-1)",
       "lp = logits.double()", "tests/test_heads.py"),
    # vitlab/inspect/tokens.py
    _m("tokens.fence_iqr", "vitlab/inspect/tokens.py", "return q3 + fence * (q3 - q1)", "return q3 + fence * q3",
       "tests/test_tokens.py"),
    _m("tokens.patch_queries", "vitlab/inspect/tokens.py", '"patches": slice(num_prefix, None)',
       '"patches": slice(0, None)', "tests/test_tokens.py"),
    # vitlab/inspect/faithfulness.py
    _m("faithfulness.pointing_touch", "vitlab/inspect/faithfulness.py", ".squeeze(1) > 0).double()",
       ".squeeze(1) >= 0).double()", *FAITH),
    _m("faithfulness.least_important_first", "vitlab/inspect/faithfulness.py",
       "argsort(dim=1, descending=True, stable=True)", "argsort(dim=1, descending=False, stable=True)", *FAITH),
    _m("faithfulness.insertion_ends", "vitlab/inspect/faithfulness.py",
       'probs["insertion"][:, 0], probs["insertion"][:, steps] = ends[1], ends[0]',
       'probs["insertion"][:, 0], probs["insertion"][:, steps] = ends[0], ends[1]', *FAITH),
    # vitlab/inspect/attribution.py
    _m("attribution.grad_rollout_relu", "vitlab/inspect/attribution.py", "(grads[layer] * maps[layer]).clamp_min(0)",
       "(grads[layer] * maps[layer])", *FAITH),
    _m("attribution.grad_rollout_identity", "vitlab/inspect/attribution.py", "v = v + v @ a", "v = v @ a", *FAITH),
    _m("attribution.target_upper_bound", "vitlab/inspect/attribution.py", "bad = (raw < 0) | (raw >= n)",
       "bad = (raw < 0) | (raw > n)", *FAITH),
)


def resolve(root: Path, mutant: Mutant) -> Path:
    """The file ``mutant`` edits under ``root``: its own path, or else the one file of that name under vitlab/ whose
    text holds ``old`` (a module moved into a sub-package). Raises LookupError where there is none or several."""
    own = root / mutant.path
    if own.exists() and own.read_text().count(mutant.old) == 1:
        return own
    name = Path(mutant.path).name
    found = [p for p in sorted((root / "vitlab").rglob(name)) if p.read_text().count(mutant.old) == 1]
    if not found:  # a function that moved to another module: the one module that holds its snippet
        found = [p for p in sorted((root / "vitlab").rglob("*.py")) if p.read_text().count(mutant.old) == 1]
    if len(found) != 1:
        raise LookupError(f"mutant {mutant.name}: {len(found)} files under vitlab/ hold its snippet exactly once "
                          f"({mutant.old!r})")
    return found[0]


def copy_checkout(dest: Path) -> None:
    """The checkout's tracked and new (not ignored) files, as a fresh clone would hold them, copied into ``dest``."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                           check=True, capture_output=True).stdout.decode().split("\0")
    for rel in filter(None, files):
        src = ROOT / rel
        if src.is_file():
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / rel)


#: third-party modules imported once by the runner, before any test run forks from it: each run then starts without
#: their import time (most of a short run's time on a busy machine). Nothing of vitlab, the tests or the benchmarks is
#: imported here, so every run imports the copy's (mutated) modules afresh.
PRELOAD = ("torch", "timm", "numpy", "scipy.stats", "scipy.special", "sklearn.linear_model", "PIL.Image", "plotly",
           "plotly.graph_objects", "captum.attr", "safetensors.torch", "tqdm.auto", "jinja2", "pytest")
OWN = ("vitlab", "benchmarks", "conftest", "_reference", "test_")


def preload() -> None:
    import importlib

    for name in PRELOAD:
        try:
            importlib.import_module(name)
        except ImportError:  # an optional extra not installed: its tests import it themselves, or skip
            pass


def _child(root: Path, tests: tuple[str, ...], log: Path) -> None:
    """In the forked child: the copy first on the path (also for the tests' own subprocesses), the output to ``log``,
    pytest run in-process; never returns."""
    code = 3
    try:
        os.setpgid(0, 0)  # its own process group: a timeout ends the tests' subprocesses too
        fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
        os.dup2(fd, 1)
        os.dup2(fd, 2)
        os.chdir(root)
        os.environ["PYTHONPATH"] = str(root)
        os.environ["PYTHONDONTWRITEBYTECODE"] = "1"
        sys.dont_write_bytecode = True
        for name in [n for n in sys.modules if n.split(".")[0].startswith(OWN)]:
            del sys.modules[name]
        sys.path[:] = [str(root), *(p for p in sys.path if p not in ("", str(ROOT)))]
        import pytest

        code = int(pytest.main(["-x", "-q", "-p", "no:cacheprovider", *tests]))
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)


def run_tests(root: Path, tests: tuple[str, ...], timeout: float) -> tuple[str, float]:
    """("passed" | "failed" | "timeout", seconds) of pytest on ``tests`` in the copy ``root``, in a child forked from
    this process (``preload``)."""
    log = root.parent / f"{root.name}.log"
    t0 = time.perf_counter()
    sys.stdout.flush()
    sys.stderr.flush()
    pid = os.fork()
    if pid == 0:
        _child(root, tests, log)
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        if time.perf_counter() - t0 > timeout:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return "timeout", time.perf_counter() - t0
        time.sleep(0.1)
    code = os.waitstatus_to_exitcode(status)
    return ("passed" if code == 0 else "failed"), time.perf_counter() - t0


def check_baselines(root: Path, mutants: list[Mutant], timeout: float) -> dict[tuple[str, ...], float]:
    """Each distinct test selection, unmutated: seconds per selection; SystemExit where one does not pass."""
    seconds = {}
    for tests in dict.fromkeys(m.tests for m in mutants):
        status, s = run_tests(root, tests, timeout)
        print(f"baseline {status:7} {s:6.1f} s  {' '.join(tests)}", flush=True)
        if status != "passed":
            print((root.parent / f"{root.name}.log").read_text()[-3000:])
            raise SystemExit(f"the unmutated tests {' '.join(tests)} do not pass ({status}): fix them first")
        seconds[tests] = s
    return seconds


def run_mutants(root: Path, mutants: list[Mutant], timeout: float) -> list[dict]:
    """Each mutant written into the copy ``root``, its tests run, the file restored: one record per mutant."""
    rows = []
    for i, m in enumerate(mutants, 1):
        path = resolve(root, m)
        original = path.read_text()
        path.write_text(original.replace(m.old, m.new, 1))
        try:
            status, s = run_tests(root, m.tests, timeout)
        finally:
            path.write_text(original)
        outcome = "survived" if status == "passed" else "killed"
        print(f"[{i:2}/{len(mutants)}] {outcome:8} {s:6.1f} s  {m.name}", flush=True)
        rows.append({**asdict(m), "file": str(path.relative_to(root)), "outcome": outcome, "tests_status": status,
                     "seconds": round(s, 1)})
    return rows


def summary(rows: list[dict], baseline_seconds: float) -> dict:
    killed = sum(r["outcome"] == "killed" for r in rows)
    return {"mutants": len(rows), "killed": killed, "score": round(killed / len(rows), 4) if rows else None,
            "survivors": [r["name"] for r in rows if r["outcome"] == "survived"],
            "baseline_test_seconds": round(baseline_seconds, 1), "results": rows}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="", help="run only the mutants whose name contains this")
    p.add_argument("--check", action="store_true", help="only check that every mutant applies; run no tests")
    p.add_argument("--timeout", type=float, default=900.0, help="seconds per pytest run (a timeout kills)")
    p.add_argument("--out", default=str(OUT), help="the JSON written ('' writes none)")
    args = p.parse_args(argv)
    mutants = [m for m in MUTANTS if args.only in m.name]
    if not mutants:
        raise SystemExit(f"no mutant's name contains {args.only!r}")
    with tempfile.TemporaryDirectory(prefix="vitlab-mutation-") as tmp:
        root = Path(tmp) / "checkout"
        copy_checkout(root)
        for m in mutants:  # every snippet found before anything runs
            resolve(root, m)
        if args.check:
            print(f"all {len(mutants)} mutants apply")
            return 0
        preload()
        base = check_baselines(root, mutants, args.timeout)
        rows = run_mutants(root, mutants, args.timeout)
    from benchmarks._util import machine_info, report  # vitlab imported only now, after every run

    result = {"machine": machine_info(), **summary(rows, sum(base.values()))}
    table = "\n".join([f"{result['killed']}/{result['mutants']} killed (score {result['score']})",
                       *(f"survived: {name}" for name in result["survivors"])])
    return report(result, table, args.out or None)


if __name__ == "__main__":
    raise SystemExit(main())
