"""vitlab.base.checks: the declarative field checks every config runs in __post_init__, and the argument checks."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from vitlab.base.checks import check_choice, check_flag, check_int, check_real, plain_int
from vitlab.base.errors import ParameterError, Setting
from vitlab.data.datasets import DataError


def test_check_int_takes_python_ints_in_range_and_numpy_ints_only_as_arguments():
    for ok in (0, 3, 10):
        check_int("n", ok, 0, 10)
    for bad in (True, 2.0, -1, 11, "3", np.int64(3), None):
        with pytest.raises(ValueError, match=f"^n must be a whole number >= 0, got {re.escape(repr(bad))}$"):
            check_int("n", bad, 0, 10)
    check_int("n", np.int64(3), 1, numpy=True)  # an argument: any whole number that indexes
    check_int("n", None, 1, none=True)
    check_int("seed", -7, None)
    with pytest.raises(DataError, match="^n must be at least one, got 0$"):
        check_int("n", 0, 1, allowed="at least one", numpy=True, error=DataError)
    assert [plain_int(v, 1) for v in (1, 0, True, 1.0, np.int64(1))] == [True, False, False, False, False]


def test_check_real_flag_and_choice_name_the_field_and_what_is_allowed():
    check_real("lr", 0.5, lambda v: v > 0, "a number > 0")
    for bad in (0, float("nan"), float("inf"), True, "0.1"):
        with pytest.raises(ValueError, match=f"^lr must be a number > 0, got {re.escape(repr(bad))}$"):
            check_real("lr", bad, lambda v: v > 0, "a number > 0")
    check_real("ema", None, none=True)
    check_flag("bf16", False)
    with pytest.raises(ParameterError) as e:
        check_flag("bf16", "False", config=True)
    assert (e.value.param, e.value.value, e.value.config) == ("bf16", "False", True)
    assert e.value.fix == (Setting("bf16", False, config=True),)
    check_choice("flip", "none", ("random", "alternating", "none"))
    with pytest.raises(ValueError, match="^flip must be 'random', 'alternating' or 'none', got 'no'$"):
        check_choice("flip", "no", ("random", "alternating", "none"))


def test_every_config_is_checked_as_it_is_made():
    """SweepConfig and MPPStudyConfig were checked only when .validate() was called: a bad one could be made, passed
    around and saved. Now every config refuses a bad field in __post_init__, as TrainConfig and the model configs."""
    from vitlab.studies.mpp import STUDIES
    from vitlab.studies.sweep_config import SWEEPS
    from vitlab.train.config import PRESETS

    for config, field in ((SWEEPS["quick"], "epochs"), (STUDIES["smoke"], "main_epochs"), (PRESETS["tiny"], "epochs"),
                          (PRESETS["tiny"].model, "depth")):
        with pytest.raises(ValueError, match=f"^{field} must be "):
            dataclasses.replace(config, **{field: 0})
        assert not hasattr(config, "validate")
