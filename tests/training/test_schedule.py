from __future__ import annotations

import itertools
import math

import pytest

from x1_pretrain.core.config import OptimConfig
from x1_pretrain.training.schedule import lr_at

LAB = OptimConfig()


@pytest.mark.parametrize("step,expected", [
    (0, 3e-4 / 1000),
    (499, 3e-4 * 500 / 1000),
    (999, 3e-4),
    (1000, 3e-4),
    (1000 + 83000 // 2, 3e-5 + 0.5 * (3e-4 - 3e-5)),
    (84000, 3e-5),
    (90000, 3e-5),
])
def test_lab_schedule_values(step, expected):
    assert math.isclose(lr_at(step, LAB, 84000), expected, rel_tol=1e-12)


def test_monotone_after_warmup():
    lrs = [lr_at(s, LAB, 5000) for s in range(1000, 5001, 50)]
    assert all(a >= b for a, b in itertools.pairwise(lrs))


def test_no_warmup_and_constant():
    assert lr_at(0, OptimConfig(warmup_steps=0), 10) == 3e-4
    assert lr_at(9, OptimConfig(warmup_steps=0, schedule="constant"), 10) == 3e-4
