"""The report's step registry: which steps run under reproduce's options, and run_steps' order and parts."""

from __future__ import annotations

from vitlab.report import run_steps
from vitlab.report.sections import Section
from vitlab.report.steps import STEPS, Context, Step, chosen


def test_step_names_are_unique_and_options_are_reproduce_keywords():
    import inspect

    from vitlab.report import reproduce

    assert len({s.name for s in STEPS}) == len(STEPS)
    keywords = set(inspect.signature(reproduce).parameters)
    assert {s.option for s in STEPS if s.option} <= keywords


def test_chosen_leaves_out_the_steps_switched_off():
    every = [s.name for s in chosen({"shapes": True, "few_shot": True, "scaling": True, "recipes": True})]
    assert every == [s.name for s in STEPS]
    fewer = [s.name for s in chosen({"shapes": False, "few_shot": True, "scaling": False, "recipes": False})]
    assert fewer == [s.name for s in STEPS if s.option not in ("shapes", "scaling", "recipes")]
    assert "localisation" not in fewer and "scaling" not in fewer and "recipes" not in fewer and "few-shot" in fewer


def _section(slug: str) -> Section:
    return Section(slug=slug, title=slug, figure=None, paper="", ours="", stamp={})


def test_run_steps_collects_sections_in_order_and_reads_the_context():
    seen = []

    def two(ctx, tick):
        tick("first")
        tick("second")
        return [_section("b"), _section("c")]

    steps = [Step("one", lambda ctx, tick: seen.append(ctx.options["k"]) or _section("a")),
             Step("two", two, parts=2), Step("none", lambda ctx, tick: None)]
    ctx = Context(inp=None, device="cpu", options={"k": 7})
    sections, seconds = run_steps(ctx, steps, progress=False)
    assert [s.slug for s in sections] == ["a", "b", "c"]
    assert seen == [7] and list(seconds) == ["one", "two", "none"]
    assert all(t >= 0 for t in seconds.values())
