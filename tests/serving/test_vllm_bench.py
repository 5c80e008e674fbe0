"""`gapprune bench --runtime vllm`: serving records a reader can trust, and parity with transformers."""

from __future__ import annotations

import json

from gapprune.cli import main


def test_vllm_bench_records_throughput_first_token_and_parity_per_folder(vllm_env, servable_folder, tmp_path,
                                                                         monkeypatch) -> None:
    folder, _ = servable_folder
    monkeypatch.setenv("GAPPRUNE_VLLM_PYTHON", vllm_env.python)
    out = tmp_path / "serving.json"
    argv = ["bench", str(folder), "--runtime", "vllm", "--batches", "1,2", "--new-tokens", "4", "--prompt-tokens", "16",
            "--repeats", "1", "--parity", "--out", str(out)]
    assert main(argv) == 0
    records = json.loads(out.read_text())
    served = [r for r in records if r["kind"] == "serving"]
    assert [r["batch"] for r in served] == [1, 2]
    for record in served:
        assert record["tokens_per_s"] > 0 and record["ttft_ms"] > 0 and record["new_tokens"] == 4
        assert record["tensor_parallel"] == 1 and record["runtime"] == "vllm"  # as the engine reports it
        assert record["vllm_version"] == vllm_env.vllm_version and record["command"].startswith("gapprune bench")
    [parity] = [r for r in records if r["kind"] == "serving_parity"]
    assert parity["greedy_identical"] == parity["prompts"] == 16
    assert abs(parity["ppl_rel_diff"]) < 1e-3  # vLLM's prompt log-probabilities give transformers' perplexity


def test_records_name_the_model_as_given_not_the_cache_folder_it_resolved_to(tmp_path) -> None:
    from gapprune.evaluate.serving import describe

    cache_folder = tmp_path / "cache" / "gguf" / "model-q4-0123456789ab"
    cache_folder.mkdir(parents=True)
    assert describe(cache_folder, given="qwen2.5-coder-0.5b") == {
        "model": "qwen2.5-coder-0.5b", "folder": "qwen2.5-coder-0.5b", "method": "dense", "ratio": 0.0,
        "ratio_of": "model"}
    assert describe(cache_folder)["folder"] == str(cache_folder)  # nothing given: the folder itself
