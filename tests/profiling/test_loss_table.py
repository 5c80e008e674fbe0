from __future__ import annotations

import numpy as np
import pytest

from gapprune.profiling import LossTable
from tests.helpers import tiny_run


@pytest.mark.parametrize("metric", ["kl", "nll"])
def test_nothing_removed_costs_exactly_zero(llama, token_ids, metric):
    table = tiny_run(llama, token_ids, metric=metric).table
    for component in ("attn", "mlp"):
        assert (table.loss[component][:, 0] == 0).all()
        assert (table.removed[component][:, 0] == 0).all()
        assert np.isfinite(table.loss[component]).all()


def test_removing_a_whole_sub_block_hurts_more_than_one_unit(llama, token_ids):
    table = tiny_run(llama, token_ids).table
    # attention options: [(2,2), (2,1)/(1,2)..., (0,0)]; MLP options: 128, 96, 64, 32, 0 channels
    assert table.options["mlp"] == [[128], [96], [64], [32], [0]]
    assert (table.loss["mlp"][:, -1] > table.loss["mlp"][:, 1]).all()
    assert (table.loss["attn"][:, -1] > table.loss["attn"][:, 1]).all()
    assert (table.loss["attn"][:, 1:] > 0).all()  # KL to the dense model is positive once anything goes


def test_loss_table_round_trips_through_json(llama, token_ids, tmp_path):
    table = tiny_run(llama, token_ids).table
    table.save(tmp_path / "loss_table.json")
    again = LossTable.load(tmp_path / "loss_table.json")
    assert again.options == table.options
    for c in ("attn", "mlp"):
        assert np.array_equal(again.loss[c], table.loss[c])
        assert np.array_equal(again.removed[c], table.removed[c])
        assert np.array_equal(again.exact[c], table.exact[c])
    assert again.param_unit == table.param_unit == 64


def test_corrupt_loss_table_is_a_clear_error(tmp_path):
    path = tmp_path / "loss_table.json"
    path.write_text("{not json")
    with pytest.raises(ValueError, match="not a readable loss table"):
        LossTable.load(path)
