"""Sections to HTML through a Jinja2 template (``templates/report.html.j2``): no analysis here."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from vitlab.findings.explain import known_reason, no_interval_reason, reason_lead
from vitlab.findings.verdict import Verdict, fmt_endpoint, fmt_threshold, runs_words
from vitlab.report.sections import Section

__all__ = ["render_html", "stamp_line", "verdict_row"]

TEMPLATES = Path(__file__).resolve().parent / "templates"
#: the page's text width in CSS px (the template's ``body`` max-width): the sections' figures are drawn to fit it
PAGE_WIDTH = 1100


def _num(x: float) -> str:
    return "n/a" if x != x else f"{x:.3g}"  # NaN-safe


def _end(x: float, threshold: float) -> str:
    """An interval endpoint with the digits that keep it on its side of the threshold (``fmt_endpoint``)."""
    return "n/a" if x != x else fmt_endpoint(x, threshold)


def _f(x: Any) -> float:
    return float("nan") if x is None else float(x)  # a record's null (NaN written as JSON) as NaN


def _conventions(v: Verdict, unit: str) -> list[dict[str, Any]]:
    """Each form of a convention the verdict was judged under, with its numbers and verdict (none for one form)."""
    if len(v.conventions) < 2:
        return []
    return [{"name": name, "verdict": c["verdict"],
             "text": f"{_num(_f(c['statistic']))}{unit} [{_end(_f(c['interval'][0]), v.threshold)}, "
                     f"{_end(_f(c['interval'][1]), v.threshold)}]"} for name, c in v.conventions.items()]


def validation_rows(sections: list[Section]) -> list[dict[str, Any]]:
    """The criterion-validation table's rows (``vitlab.findings.controls.validation_table``) with their texts."""
    from vitlab.findings.controls import validation_table

    rows = []
    for r in validation_table(v for s in sections for v in s.verdicts):
        lo, hi = (_f(x) for x in r["interval"])
        rows.append({**r, "statistic_text": f"{_num(_f(r['statistic']))} [{_num(lo)}, {_num(hi)}]",
                     "css": "reproduced" if r["passed"] else "not-reproduced"})
    return rows


def verdict_row(v: Verdict, slug: str = "") -> dict[str, Any]:
    lo, hi = v.interval
    unit = f" {v.unit}" if v.unit else ""
    reason = known_reason(v)  # None without an interval: then no_interval says why the data decided nothing
    return {"slug": slug, "finding": v.finding, "criterion": v.criterion, "verdict": v.verdict, "label": v.label,
            "threshold_source": v.threshold_source, "conventions": _conventions(v, unit),
            "reason": reason if v.verdict != "reproduced" else None, "reason_lead": reason_lead(v),
            "no_interval": no_interval_reason(v),
            "css": v.verdict.replace(" ", "-"), "side": v.side, "subject": v.subject or "-",
            "runs": runs_words(v.n_runs),
            "threshold_text": "n/a" if v.threshold != v.threshold else fmt_threshold(v.threshold),
            "statistic_text": f"{v.quantity} {_num(v.statistic)}{unit} "
                              f"[{_end(lo, v.threshold)}, {_end(hi, v.threshold)}]"}


def stamp_line(stamp: dict[str, Any]) -> str:
    """A stamp as one readable line: model, weights, images, versions, settings."""
    parts = [f"model {stamp.get('model')}", f"weights {stamp.get('weights')}"]
    if stamp.get("images"):
        parts.append(f"images: {stamp['images']}")
    versions = stamp.get("versions") or {}
    if versions:
        parts.append(", ".join(f"{k} {v}" for k, v in versions.items()))
    settings = stamp.get("settings") or {}
    if settings:
        parts.append("settings: " + ", ".join(f"{k}={v}" for k, v in settings.items()))
    return " · ".join(parts)


def render_html(summary: dict[str, Any], sections: list[Section]) -> str:
    """The report page: summary facts, the verdict table (then what was not judged, and why), then each section
    (plotly embedded once, offline)."""
    import jinja2

    env = jinja2.Environment(loader=jinja2.FileSystemLoader(str(TEMPLATES)), autoescape=True,
                             undefined=jinja2.StrictUndefined)
    rows, first = [], True
    for s in sections:
        if s.hidden:
            continue
        html = None
        if s.figure is not None:
            html = s.figure.to_html(full_html=False, include_plotlyjs=first)
            first = False
        rows.append({"slug": s.slug, "title": s.title, "figure_html": html, "paper": s.paper, "ours": s.ours,
                     "verdicts": [verdict_row(v, s.slug) for v in s.verdicts], "stamp_line": stamp_line(s.stamp)})
    verdicts = [verdict_row(v, s.slug) for s in sections for v in s.verdicts]
    not_judged = [{"slug": "" if s.hidden else s.slug, "finding": what, "reason": why} for s in sections
                  for what, why in s.not_judged]  # a hidden section has no anchor to link to
    return env.get_template("report.html.j2").render(summary=summary, sections=rows, verdicts=verdicts,
                                                        validation=validation_rows(sections),
                                                        not_judged=not_judged, page_width=PAGE_WIDTH)
