"""The literature's evaluation protocols by name, so a number can be set beside the papers' tables.

A protocol fixes the data sets, window length, windows (always the whole test split) and tasks
(always in full, no `--limit`); its name goes into every record it produces.
"""

from __future__ import annotations

from dataclasses import dataclass

from gapprune.evaluate.zeroshot import TASKS


@dataclass(frozen=True)
class Protocol:
    name: str
    datasets: tuple[str, ...]  # perplexity on the whole test split of each
    seq_len: int
    tasks: tuple[str, ...]  # zero-shot, every example
    used_by: str


PROTOCOLS = {p.name: p for p in (
    Protocol("llm-pruner", ("wikitext2", "ptb"), 128, tuple(TASKS),
             "LLM-Pruner, FLAP, SlimLLM: whole WikiText-2 and PTB test sets in windows of 128 tokens, 7 tasks in full"),
    Protocol("slicegpt", ("wikitext2",), 2048, (),
             "SliceGPT, ShortGPT, SLEB: the whole WikiText-2 test set in windows of 2,048 tokens"),
)}


def get_protocol(name: str) -> Protocol:
    if name not in PROTOCOLS:
        raise ValueError(f"unknown protocol {name!r}: choose from {', '.join(PROTOCOLS)}")
    return PROTOCOLS[name]


def refuse_overrides(protocol: Protocol, given: dict[str, object]) -> None:
    """A protocol's numbers are comparable only as the protocol fixes them: no flag may change it."""
    changed = [flag for flag, value in given.items() if value is not None]
    if changed:
        raise ValueError(f"--protocol {protocol.name} fixes the data sets, windows, lengths and tasks; "
                         f"drop {', '.join(changed)} or drop --protocol")
