"""The profiler registry says what each profiler supports, and `check_supported` refuses the rest."""

from __future__ import annotations

import pytest

from gapprune.config import PruneConfig
from gapprune.profiling.profilers import PROFILERS, check_supported


def test_every_registered_profiler_is_a_valid_setting_and_no_other():
    for name in PROFILERS:
        assert PruneConfig(ratio=0.2, profiler=name).profiler == name
    with pytest.raises(ValueError, match="profiler must be"):
        PruneConfig(ratio=0.2, profiler="guess")


def test_a_compensation_aware_table_needs_a_replaying_profiler():
    config = PruneConfig(ratio=0.2, profiler="fisher", compensation_aware=True)
    with pytest.raises(ValueError, match="set profiler to auto or exact instead of fisher"):
        check_supported(config, streamed=False)
    check_supported(PruneConfig(ratio=0.2, profiler="exact", compensation_aware=True), streamed=False)


@pytest.mark.parametrize("settings, message", [
    ({"profiler": "fisher"}, "profiled by the exact layer-major profiler"),
    ({"compensation_aware": True}, "not supported with a streamed model"),
    ({"criterion": "taylor"}, "needs gradients of every layer"),
    ({"refine": 1}, "does not run on a streamed model"),
])
def test_a_streamed_model_refuses_what_needs_every_layer(settings, message):
    config = PruneConfig(ratio=0.2, **settings)
    check_supported(config, streamed=False)
    with pytest.raises(ValueError, match=message):
        check_supported(config, streamed=True)


def test_a_given_plan_or_a_baseline_allocator_is_not_refused_when_streamed():
    config = PruneConfig(ratio=0.2, profiler="fisher")
    check_supported(config, streamed=True, plan_given=True)
    check_supported(PruneConfig(ratio=0.2, profiler="fisher", allocator="uniform"), streamed=True)
