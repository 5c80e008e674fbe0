"""The tuning progress bar counts what ends the run: seconds under a time budget, steps otherwise."""

from gapprune.tune.progress import advance, training_bar


def test_time_budget_bar_counts_training_seconds() -> None:
    bar = training_bar("distil", total_steps=100000, step=3, max_seconds=60.0, seconds_done=12.0)
    assert bar.total == 60.0 and bar.n == 12.0  # resumed: starts at the seconds already trained
    advance(bar, max_seconds=60.0, seconds_done=20.5)
    assert bar.n == 20.5
    advance(bar, max_seconds=60.0, seconds_done=61.3)  # the last step ends past the budget
    assert bar.n == 60.0
    bar.close()


def test_resumed_past_the_budget_bar_still_prints() -> None:
    bar = training_bar("distil", total_steps=100000, step=9, max_seconds=60.0, seconds_done=75.0)
    assert bar.n == 60.0 and "60/60 s" in str(bar)
    bar.close()


def test_step_bar_counts_steps() -> None:
    bar = training_bar("LoRA", total_steps=40, step=5, max_seconds=0.0, seconds_done=0.0)
    assert bar.total == 40 and bar.n == 5
    advance(bar, max_seconds=0.0, seconds_done=99.0)
    assert bar.n == 6
    bar.close()
