"""The sweep on a local ray runtime: a file of its own, since starting the runtime takes most of a minute of waiting
and ``make test`` (``--dist loadfile``) then runs it beside the rest of the sweep tests instead of after them."""

from __future__ import annotations

import dataclasses

import pytest

from vitlab.studies.scaling import SWEEPS, run_sweep


def test_two_runs_on_a_local_ray_runtime(tmp_path):
    pytest.importorskip("ray")
    sweep = dataclasses.replace(SWEEPS["quick"], name="ray", sizes=(40,))
    # one CPU: both runs queue for one Ray worker, so one worker process (not two) imports vitlab and its data
    new = run_sweep(sweep, tmp_path / "r.jsonl", executor="ray", workers=1, progress=False)
    assert sorted(r["run_id"] for r in new) == ["bit_tiny-n40-s0", "vit_tiny-n40-s0"]
    assert all(r["status"] == "ok" for r in new), [r.get("traceback") for r in new]
