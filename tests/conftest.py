"""Shared fixtures: tiny seeded random models built from configs (no download), and a leak check."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch
from transformers import (
    Gemma3ForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    LlamaForCausalLM,
    MistralConfig,
    MistralForCausalLM,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen3Config,
    Qwen3ForCausalLM,
)

REPO = Path(__file__).resolve().parents[1]


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, tie_word_embeddings=False,
    )
    config.architectures = ["LlamaForCausalLM"]
    return LlamaForCausalLM(config).eval()


def tiny_qwen3(seed: int = 0) -> Qwen3ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen3Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=6,
        num_key_value_heads=2, head_dim=16, vocab_size=256, max_position_embeddings=256, tie_word_embeddings=True,
    )
    config.architectures = ["Qwen3ForCausalLM"]
    return Qwen3ForCausalLM(config).eval()


def tiny_qwen2(seed: int = 0) -> Qwen2ForCausalLM:
    torch.manual_seed(seed)
    config = Qwen2Config(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256,
    )
    config.architectures = ["Qwen2ForCausalLM"]
    return Qwen2ForCausalLM(config).eval()


def tiny_mistral(seed: int = 0) -> MistralForCausalLM:
    """Sliding-window attention (window 8 < the 24-token test batch), grouped-query, untied head."""
    torch.manual_seed(seed)
    config = MistralConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, vocab_size=256, max_position_embeddings=256, sliding_window=8,
        tie_word_embeddings=False,
    )
    config.architectures = ["MistralForCausalLM"]
    return MistralForCausalLM(config).eval()


def tiny_gemma3(seed: int = 0, n_kv_heads: int = 2) -> Gemma3ForCausalLM:
    """Sliding and global layers (window 8 < the 24-token test batch), random norm weights so that the
    pre/post, q/k norms all act, tied scaled embeddings."""
    torch.manual_seed(seed)
    config = Gemma3TextConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=n_kv_heads, head_dim=16, query_pre_attn_scalar=16, vocab_size=256,
        max_position_embeddings=256, sliding_window=8,
        layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
    )
    config.architectures = ["Gemma3ForCausalLM"]
    model = Gemma3ForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("norm.weight"):
                param.uniform_(-0.5, 0.5)  # Gemma norms scale by (1 + weight); init is all zeros
    return model


FAMILIES = {"llama": tiny_llama, "mistral": tiny_mistral, "qwen3": tiny_qwen3, "qwen2": tiny_qwen2, "gemma3": tiny_gemma3}


@pytest.fixture(params=sorted(FAMILIES))
def tiny_model(request: pytest.FixtureRequest) -> torch.nn.Module:
    return FAMILIES[request.param]()


@pytest.fixture
def llama() -> LlamaForCausalLM:
    return tiny_llama()


@pytest.fixture
def token_ids() -> torch.Tensor:
    return torch.randint(0, 256, (4, 24), generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="session")
def auto_ids() -> torch.Tensor:
    """Eight windows of 32 tokens: what the auto profiler's tests calibrate the tiny Llama on."""
    return torch.randint(0, 256, (8, 32), generator=torch.Generator().manual_seed(3))


@pytest.fixture(scope="session")
def auto_exact_run(auto_ids: torch.Tensor):  # type: ignore[no-untyped-def]
    """The tiny Llama's exact profile on `auto_ids` (channel step 16): the truth the auto profiler is checked against."""
    from tests.helpers import tiny_run

    return tiny_run(tiny_llama(), auto_ids, channel_step=16)


@pytest.fixture(scope="session")
def data_dir() -> Path:
    value = os.environ.get("GAPPRUNE_DATA")
    path = Path(value) if value else REPO.parent / "shared" / "data"
    if not (path / "wikitext-2-raw").is_dir():
        skip_or_fail(f"no data folder at {path}: set GAPPRUNE_DATA")
    return path


STRICT_ENV = "GAPPRUNE_STRICT"  # set by .ci/run: a test that cannot run there fails instead of skipping


DATA_PARTS = ("wikitext-2-raw", "ptb", "c4", "code", "humaneval", "commonsense", "alpaca")
_skipped_under_strict: list[str] = []


def pytest_sessionstart(session: pytest.Session) -> None:
    """Under .ci/run, stop before the first test when the data folder is not all there: a CI run that lost
    its data must fail, not pass on the tests that do not read it."""
    if not os.environ.get(STRICT_ENV):
        return
    value = os.environ.get("GAPPRUNE_DATA")
    folder = Path(value) if value else REPO.parent / "shared" / "data"
    missing = [part for part in DATA_PARTS if not (folder / part).is_dir() or not any((folder / part).iterdir())]
    if missing:
        pytest.exit(f"${STRICT_ENV} is set and the data folder {folder} lacks {', '.join(missing)}: "
                    "set GAPPRUNE_DATA to the folder holding the evaluation data", returncode=3)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if os.environ.get(STRICT_ENV) and report.skipped and not hasattr(report, "wasxfail"):
        _skipped_under_strict.append(report.nodeid)


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under .ci/run a skipped test fails the run: every part it needs is installed there."""
    if _skipped_under_strict and exitstatus == 0:
        print(f"\n${STRICT_ENV} is set and {len(_skipped_under_strict)} tests skipped: {_skipped_under_strict[:5]}")
        session.exitstatus = 1


def skip_or_fail(reason: str) -> None:
    """Skip on a developer's machine that lacks a part; fail under .ci/run, where every part must be there."""
    if os.environ.get(STRICT_ENV):
        pytest.fail(f"{reason} (${STRICT_ENV} is set: under .ci/run this test must run)")
    pytest.skip(reason)


@pytest.fixture(autouse=True)
def no_stray_files() -> object:
    """Fail a test that leaves files in the repository (write under tmp_path instead)."""
    def snapshot() -> set[str]:
        skip = {".git", ".venv", ".venv-vllm", ".pytest_cache", "__pycache__", "runs", ".mypy_cache", ".ruff_cache"}
        found = set()
        for root, dirs, files in os.walk(REPO):
            dirs[:] = [d for d in dirs if d not in skip and not d.endswith(".egg-info")]
            found.update(os.path.relpath(os.path.join(root, f), REPO) for f in files)
        return found

    before = snapshot()
    yield
    stray = snapshot() - before
    assert not stray, f"test left files behind: {sorted(stray)[:5]}"


TINY_TEXT = (
    "The quick brown fox jumps over the lazy dog. A model that is pruned keeps the units that matter, "
    "and the budget decides how many go in every layer. Calibration text feeds the dense pass once; "
    "profiling replays the tail of the network for every option. "
) * 40


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny seeded Llama with a real (byte-level BPE) tokenizer saved as a folder, and a calibration text file.

    Lets the CLI run end to end on CPU in seconds, with no download and no data folder.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    root = tmp_path_factory.mktemp("tiny")
    text_file = root / "calib.txt"
    text_file.write_text(TINY_TEXT)
    bpe = Tokenizer(models.BPE(unk_token=None))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator([TINY_TEXT], trainers.BpeTrainer(vocab_size=300, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), special_tokens=["<eos>"]))
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<eos>")
    model = tiny_llama()
    model.resize_token_embeddings(bpe.get_vocab_size())
    folder = root / "model"
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, text_file
