"""Gram matrices of the output projections' inputs, one layer at a time.

Shared by the criteria that read them (obs) and the compensation that solves with them (lsq, bias),
so they live below both. An MLP Gram is intermediate² floats: for every layer at once that is
28 × 8,960² × 4 B × 2 halves = 18 GB on Qwen2.5-1.5B, more than its weights. `LayerGrams`
therefore holds one layer's Grams: they are taken while the calibration pass runs layer l over the
whole calibration set (it is layer-major, `engine/capture.py`), and the unit scores are read from
them there; asked later for layer l (compensation), it replays the dense layer l from the cached
layer inputs (same batches, same order, so the same sums) and drops the previous layer's. Readers
call `ensure(layer)` before they read a layer's entries. A reader that is the matrices' last use
(OBS scoring) takes them with `handover(key)` and sums the halves in place instead of copying them:
on a 1.5B model that is two 321 MB buffers fewer at the peak of scoring, and a later reader of the
key gets the layer replayed.

When a half sees few tokens against the projection's width (t ≤ n / 16, `TOKEN_ROWS_FACTOR`: a
wide MLP with little calibration data), the Gram is held as its
rows X (t × n, `TokenGram`) instead of XᵀX (n × n): the solves that read it (obs, lsq) then work
in the t-dimensional token space (Woodbury), and memory is t·n, not n².

The matrices are accumulated where the activations are. On a GPU they stay there when it can also
hold the solves that read them (`solve_device`): OBS and the lsq re-fit then run on the GPU, in
float32 as on the CPU, and the host's cores are not the wait of a 7B prune. The CPU is the
fallback when the GPU's free memory is short.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import pairwise

import torch
from torch import nn

from gapprune.components import COMPONENTS
from gapprune.config import TOKEN_ROWS_FACTOR
from gapprune.engine.capture import LayerInputs, replay_layer
from gapprune.engine.observe import ObservationPoints, Observer, observing
from gapprune.models.adapter import ModelAdapter


class TokenGram:
    """XᵀX held as the rows X (t, n), float32: what a half of the calibration tokens gives when t ≪ n.

    Readers work from `rows` (`quadratic`, the token-space solves) rather than the n × n matrix."""

    def __init__(self, n: int, parts: list[torch.Tensor] | None = None) -> None:
        self.n, self.parts = n, parts or []

    @property
    def rows(self) -> torch.Tensor:
        if len(self.parts) != 1:
            self.parts = [torch.cat(self.parts) if self.parts else torch.zeros(0, self.n)]
        return self.parts[0]

    def add_(self, x: torch.Tensor) -> None:
        self.parts.append(x.detach().float().clone())

    def dense(self) -> torch.Tensor:
        return self.rows.T @ self.rows

    def to(self, device: str | torch.device) -> TokenGram:
        return TokenGram(self.n, [self.rows.to(device)])

    @property
    def device(self) -> torch.device:
        return self.rows.device

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts)

    def __add__(self, other: TokenGram) -> TokenGram:
        return TokenGram(self.n, [torch.cat([self.rows, other.rows])])


Gram = torch.Tensor | TokenGram  # (n, n) XᵀX, or its rows

SOLVE_HEADROOM = 4  # a solve holds about this many times its Grams' bytes (OBS: the inverse, updates, the weight)


def solve_device(device: torch.device, nbytes: int) -> torch.device:
    """Where solves on Grams of `nbytes`, accumulated on `device`, run: a GPU when its free memory
    holds them `SOLVE_HEADROOM` times over, else the CPU."""
    if device.type != "cuda":
        return torch.device("cpu")
    free, _ = torch.cuda.mem_get_info(device)
    return device if free >= SOLVE_HEADROOM * nbytes else torch.device("cpu")


def quadratic(d: torch.Tensor, gram: Gram) -> torch.Tensor:
    """tr(D G Dᵀ) in float64 (products in float32): D (out, n)."""
    d = d.float()
    if isinstance(gram, TokenGram):
        return (d @ gram.rows.T).square().sum(dtype=torch.float64)  # ||D Xᵀ||²
    return ((d @ gram.float()) * d).sum(dtype=torch.float64)


@dataclass
class GramStats:
    """Per (layer, component): Gram matrices of the output projection's input on two halves of the
    calibration batches (fit, held out), and the input mean for `bias`."""

    fit: dict[tuple[int, str], Gram] = field(default_factory=dict)  # (n_in, n_in) float32, or its rows
    held_out: dict[tuple[int, str], Gram] = field(default_factory=dict)
    sums: dict[tuple[int, str], list[torch.Tensor]] = field(default_factory=dict)  # [fit, held out] (n_in,) float64
    counts: dict[tuple[int, str], list[int]] = field(default_factory=dict)  # [fit, held out] tokens
    batches: dict[tuple[int, str], int] = field(default_factory=dict)

    def fit_mean(self, key: tuple[int, str]) -> torch.Tensor:
        return self.sums[key][0] / max(self.counts[key][0], 1)

    def ensure(self, layer: int, key: tuple[int, str] | None = None) -> None:
        """Make `layer`'s entries (or `key`'s) readable (all are, here: they were accumulated by hooks)."""

    def handover(self, key: tuple[int, str]) -> list[Gram] | Callable[[], list[Gram]]:
        """`key`'s two halves for a solve. Borrowed here (the caller must not change them); `LayerGrams`
        hands them over instead, as a function that gives up its own references."""
        return [self.fit[key], self.held_out[key]]

    def swapped(self) -> GramStats:
        """The halves exchanged: fit on the held-out batches, check on the fit ones."""
        return GramStats(fit=self.held_out, held_out=self.fit, sums={k: v[::-1] for k, v in self.sums.items()},
                         counts={k: v[::-1] for k, v in self.counts.items()}, batches=dict(self.batches))

    def settle_(self) -> None:
        """Put the accumulated matrices where their solves run (`solve_device`): left on a GPU that can
        hold them, else moved to the CPU (in place: views share the dicts)."""
        grams = [*self.fit.values(), *self.held_out.values()]
        if not grams:
            return
        nbytes = sum(g.nbytes for g in grams)
        device = solve_device(grams[0].device, nbytes)
        for table in (self.fit, self.held_out):
            for key, value in table.items():
                table[key] = value.to(device)
        for key, sums in self.sums.items():
            self.sums[key] = [t.to(device) for t in sums]

    def n_matrices(self) -> int:
        """Gram matrices held now (both halves counted): what a memory test watches."""
        return len(self.fit) + len(self.held_out)


class LayerGrams(GramStats):
    """The Grams of the dense model's output projections, computed for one layer when asked and
    dropped when another layer is asked for (see the module docstring).

    The model must still be dense in `layer` when `ensure(layer)` first runs for it: callers that
    prune ask before the surgery (`prune_and_compensate_`). `swapped()` is a view with the halves
    exchanged that shares the one cached layer.
    """

    def __init__(self, adapter: ModelAdapter, inputs: LayerInputs | None = None, source: LayerGrams | None = None) -> None:
        super().__init__()
        self.adapter, self.inputs, self.source = adapter, inputs, source
        self.layer: int | None = None
        self.taken: set[tuple[int, str]] = set()  # keys handed over since the layer was replayed
        self.replays = 0  # layers replayed so far (each costs one pass of that layer over the calibration set)

    def ensure(self, layer: int, key: tuple[int, str] | None = None) -> None:
        if self.source is not None:  # a swapped view: refresh from the shared cache
            self.source.ensure(layer, key)
            src = self.source
            self.fit, self.held_out, self.layer = src.held_out, src.fit, src.layer
            self.sums = {k: v[::-1] for k, v in src.sums.items()}
            self.counts = {k: v[::-1] for k, v in src.counts.items()}
            self.batches = dict(src.batches)
            return
        if self.layer == layer and not (self.taken and (key is None or key in self.taken)):
            return
        if self.inputs is None:
            raise ValueError("these Grams are taken during the capture pass; give them its layer inputs to replay layers")
        with self.accumulating(layer, self.inputs.hidden[layer]), torch.inference_mode():
            replay_layer(self.adapter, layer, self.inputs.hidden[layer], self.inputs.kwargs[layer])
        self.replays += 1

    @contextmanager
    def accumulating(self, layer: int, batches: list[torch.Tensor]) -> Iterator[None]:
        """Hooks that take `layer`'s Grams from whatever runs the dense layer over `batches` (its
        calibration inputs) inside: `ensure`'s replay, or the capture pass itself, which then
        leaves nothing to replay (`engine/capture.py`, `around_layer`)."""
        self.release()
        points: ObservationPoints = [(out, gram_observer(out, (layer, c), self, tokens_per_half(batches), upper=True))
                                     for c in COMPONENTS if (out := self.adapter.out_proj(layer, c)) is not None]
        with observing(points):
            yield
        for table in (self.fit, self.held_out):
            for value in table.values():
                if isinstance(value, torch.Tensor):
                    mirror_upper_(value)
        self.settle_()
        self.layer = layer

    def release(self) -> None:
        """Drop the cached layer's matrices (in place: swapped views share these dicts)."""
        for table in (self.fit, self.held_out, self.sums, self.counts, self.batches):
            table.clear()
        self.taken.clear()
        self.layer = None

    def handover(self, key: tuple[int, str]) -> Callable[[], list[Gram]]:
        """A function that returns `key`'s halves and drops this cache's references to them, so the
        caller owns the only ones; asked again (OBS retrying in float64), it replays the layer."""
        if self.source is not None:
            take = self.source.handover(key)
            return lambda: take()[::-1]

        def take_halves() -> list[Gram]:
            self.ensure(key[0], key)
            self.taken.add(key)
            return [self.fit.pop(key), self.held_out.pop(key)]

        return take_halves

    def swapped(self) -> GramStats:
        return LayerGrams(self.adapter, self.inputs, source=self)


def tokens_per_half(batches: list[torch.Tensor]) -> int:
    """The tokens of the larger half of `batches` (B, T, h): even ones fit, odd ones hold out."""
    return max(sum(int(h.shape[0] * h.shape[1]) for h in batches[half::2]) for half in (0, 1))


UPPER_BLOCK = 1024  # rows per block when a Gram is accumulated by its upper triangle (`add_upper_`)


def upper_blocks(n: int) -> list[tuple[int, int]]:
    """Row blocks [a, b) of an n × n Gram accumulated by its upper triangle; one block (the whole
    product) below two `UPPER_BLOCK`s, where the saving is small and the blocks' products would be
    narrow enough to round differently from the whole one."""
    k = max(1, n // UPPER_BLOCK)
    edges = [round(i * n / k) for i in range(k + 1)]
    return list(pairwise(edges))


def add_upper_(target: torch.Tensor, x: torch.Tensor) -> None:
    """target += XᵀX on and above the diagonal blocks only, (k + 1) / 2k of the product's work for k
    blocks: 0.41 s instead of 0.79 s for 1,024 tokens of an 8,960-wide MLP (two cores). Each block
    row is its own product, then added, as the whole product is: on the CPUs measured its entries
    are the whole product's to the bit (`docs/performance.md` §14). `mirror_upper_` completes it."""
    blocks = upper_blocks(x.shape[1])
    if len(blocks) == 1:
        target += x.T @ x
        return
    for a, b in blocks:
        target[a:b, a:] += x[:, a:b].T @ x[:, a:]


def mirror_upper_(target: torch.Tensor) -> None:
    """Fill the blocks below the diagonal of a Gram that `add_upper_` accumulated from those above."""
    for a, b in upper_blocks(target.shape[1])[:-1]:
        target[b:, a:b] = target[a:b, b:].T


def gram_observer(linear: nn.Linear, key: tuple[int, str], into: GramStats, tokens_per_half: int | None = None,
                  rows_factor: int | None = None, upper: bool = False) -> Observer:
    """Accumulate the Gram matrix of `linear`'s input under `key` (observed by the engine: `observing`):
    even batches fit, odd ones hold out.
    Given the tokens a half will see, a projection at least `rows_factor` times that wide keeps the
    rows instead (`TokenGram`); by default `TOKEN_ROWS_FACTOR`, which OBS's greedy steps need.
    `upper`: an n × n Gram is accumulated by its upper triangle (`add_upper_`), and the caller
    completes it with `mirror_upper_` once the pass is over."""
    n = linear.in_features
    factor = TOKEN_ROWS_FACTOR if rows_factor is None else rows_factor
    rows = tokens_per_half is not None and tokens_per_half * factor <= n
    into.fit[key] = TokenGram(n) if rows else torch.zeros(n, n)
    into.held_out[key] = TokenGram(n) if rows else torch.zeros(n, n)
    into.sums[key] = [torch.zeros(n, dtype=torch.float64), torch.zeros(n, dtype=torch.float64)]
    into.counts[key], into.batches[key] = [0, 0], 0

    def observe(inputs: torch.Tensor) -> None:
        x = inputs.detach().reshape(-1, inputs.shape[-1]).float()  # (tokens, n_in), float32 on the layer's device
        half = into.batches[key] % 2
        target = (into.held_out if half else into.fit)[key]
        if isinstance(target, TokenGram):
            target.add_(x)
        else:
            if target.device != x.device:  # accumulate where the activations are (a GPU); `settle_` after
                into.fit[key], into.held_out[key] = into.fit[key].to(x.device), into.held_out[key].to(x.device)
            dense = (into.held_out if half else into.fit)[key]
            assert isinstance(dense, torch.Tensor)
            if upper:
                add_upper_(dense, x)
            else:
                dense += x.T @ x
        if into.sums[key][0].device != x.device:
            into.sums[key] = [t.to(x.device) for t in into.sums[key]]
        into.sums[key][half] += x.double().sum(0)
        into.counts[key][half] += x.shape[0]
        into.batches[key] += 1

    return observe


def gram_observers(adapter: ModelAdapter, into: GramStats) -> Callable[[], ObservationPoints]:
    """For `capture_layer_inputs(observers=...)`: every output projection's input Gram."""

    def points() -> ObservationPoints:
        return [(out, gram_observer(out, (layer, component), into)) for layer in range(adapter.n_layers)
                for component in COMPONENTS if (out := adapter.out_proj(layer, component)) is not None]

    return points
