"""Where a runtime keeps its measured cost table."""

from __future__ import annotations


def test_a_runtime_caches_its_costs_where_every_other_cache_lives(tiny_model_folder, tmp_path, monkeypatch) -> None:
    """Without a profile folder the cost table goes under the cache folder models use ($XDG_CACHE_HOME when
    $GAPPRUNE_CACHE is unset), not a second, hard-coded ~/.cache."""
    from gapprune.runtimes import base
    from gapprune.runtimes.llamacpp import LlamaCpp

    monkeypatch.delenv("GAPPRUNE_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    where = []
    monkeypatch.setattr(base, "load_or_measure", lambda path, key, measure: where.append(path))
    folder, _ = tiny_model_folder
    LlamaCpp(LlamaCpp.settings_for("f32", 1)).costs(str(folder), None, timed=False)
    assert where and where[0].is_relative_to(tmp_path / "xdg" / "gapprune" / "costs" / folder.name)
