"""A stopped perplexity run goes on where it stopped and gives the fresh run's number exactly."""

from __future__ import annotations

import importlib
import json

import pytest
import torch

from gapprune.evaluate.perplexity import perplexity

ppl_module = importlib.import_module("gapprune.evaluate.perplexity")  # the package re-exports a function of that name
REAL_TOKEN_NLL = ppl_module.token_nll


class Killed(Exception):
    """Stands for a kill between two batches."""


@pytest.fixture
def windows() -> torch.Tensor:
    return torch.randint(0, 256, (10, 16), generator=torch.Generator().manual_seed(2))


def count_batches(monkeypatch, stop_after: int | None = None) -> list[int]:
    """Record the rows of each scored batch; raise (a kill) after `stop_after` batches."""
    seen: list[int] = []

    def counted(model, ids):
        if stop_after is not None and len(seen) == stop_after:
            raise Killed
        seen.append(ids.shape[0])
        return REAL_TOKEN_NLL(model, ids)

    monkeypatch.setattr(ppl_module, "token_nll", counted)
    return seen


def test_a_stopped_run_scores_only_the_windows_it_had_not_scored(llama, windows, tmp_path, monkeypatch):
    fresh = perplexity(llama, windows, batch_size=3, progress=False)
    count_batches(monkeypatch, stop_after=2)
    with pytest.raises(Killed):
        perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    seen = count_batches(monkeypatch)
    resumed = perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    assert seen == [3, 1]  # windows 6..9 only
    assert resumed.windows_resumed == 6 and fresh.windows_resumed == 0
    assert resumed.nll == fresh.nll and resumed.ppl == fresh.ppl


def test_kept_windows_are_not_served_to_other_weights_windows_or_batches(llama, windows, tmp_path, monkeypatch):
    perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    for other_windows, batch_size in ((windows, 5), (windows[:, :12], 3)):
        assert perplexity(llama, other_windows, batch_size=batch_size, progress=False,
                          resume=tmp_path).windows_resumed == 0
    with torch.no_grad():
        llama.model.layers[0].mlp.down_proj.weight[0, 0] += 1e-3
    seen = count_batches(monkeypatch)
    changed = perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    assert changed.windows_resumed == 0 and sum(seen) == 10


def test_a_changed_config_is_not_served_the_kept_windows(llama, windows, tmp_path):
    perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    llama.config.rms_norm_eps *= 10  # not a weight: the state dict is the same
    assert perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path).windows_resumed == 0


@pytest.mark.parametrize("content", ["{not json", '{"nll": [1.0, 2.0]}', json.dumps({"nll": [1.0] * 11}),
                                     '{"nll": ["a", "b", "c"]}', '{"other": []}'])
def test_a_log_that_does_not_fit_is_set_aside_and_everything_scored(llama, windows, tmp_path, caplog, content):
    fresh = perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    [path] = tmp_path.glob("ppl-*.json")
    path.write_text(content)  # torn, a partial batch, more windows than there are, not numbers, no list
    with caplog.at_level("WARNING"):
        again = perplexity(llama, windows, batch_size=3, progress=False, resume=tmp_path)
    assert again.windows_resumed == 0 and again.nll == fresh.nll
    assert str(path) in caplog.text
