"""Cost tables for llama.cpp from microbenchmarks of synthetic GGUFs on this machine.

Every grid point is a whole model (the real hidden size, vocabulary, layer count) whose layers all
take one shape: attention only with (heads, KV heads), or MLP only with a width, or nothing (the
base: embedding, head and per-token overheads). Per layer, a component's time is (T_point - T_base)
/ n_layers. Other people's jobs share the cores, so each point is timed back to back with the dense
shape and kept as a ratio to it (times are those ratios times the dense shape's median time).
Attention has few options (one grid point each); MLP widths are a grid, interpolated linearly in
the padded width between points, and the interpolation is checked on held-out widths. Whole-model
check points (uniform and mixed shapes) report how well the additive model predicts.
"""

from __future__ import annotations

import itertools
import logging
import platform
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from gapprune.budgets import memory
from gapprune.budgets.measure import Timing, time_gguf
from gapprune.budgets.synthetic import write_synthetic_gguf
from gapprune.budgets.table import ModelDims, RuntimeCosts
from gapprune.components import COMPONENTS

log = logging.getLogger(__name__)
RUNTIMES = ("llama.cpp",)
Shapes = list[tuple[int, int, int]]


@dataclass(frozen=True)
class BenchSettings:
    """How the microbenchmarks time a GGUF (the verification uses the same)."""

    file_type: str = "q8_0"
    threads: int = 1
    prompt_tokens: int = 32
    new_tokens: int = 32
    repeats: int = 3
    mlp_grid: int = 6  # measured MLP widths (besides 0), evenly spaced, full width included
    seed: int = 0


def machine_id() -> str:
    """Host name and CPU model: cost tables are kept per machine."""
    cpu = ""
    try:
        cpu = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                    if line.startswith("model name")), "")
    except OSError:
        pass
    return f"{platform.node()} | {cpu or platform.processor()}"


# Raised whenever the memory formulas or the fit change, so tables cached by older code are measured again.
COST_MODEL_VERSION = 2


def cost_key(model: str, settings: BenchSettings, runtime: str = "llama.cpp") -> dict[str, Any]:
    return {"runtime": runtime, "machine": machine_id(), "model": model, **asdict(settings),
            "cost_model": COST_MODEL_VERSION}


def mlp_grid(dims: ModelDims, settings: BenchSettings) -> tuple[list[int], list[int]]:
    """(measured, held-out) padded MLP widths: n evenly spaced points, and the midpoints between them."""
    block = memory.padded_width(1, settings.file_type)
    pts = np.linspace(0, dims.intermediate, settings.mlp_grid + 1)[1:]
    grid = sorted({memory.padded_width(max(block, round(w / block) * block), settings.file_type) for w in pts})
    mids = [memory.padded_width(round((a + b) / 2 / block) * block, settings.file_type)
            for a, b in itertools.pairwise(grid)]
    return grid, [m for m in mids if m not in grid]


def measure_points(dims: ModelDims, points: dict[str, Shapes], tokenizer_gguf: str | Path, settings: BenchSettings,
                   workdir: Path, timer: Callable[[Path], Timing] | None = None) -> dict[str, dict[str, float]]:
    """Time every named model shape back to back with the dense one; times rescaled to the dense median."""
    timer = timer or (lambda p: time_gguf(p, settings.threads, settings.prompt_tokens, settings.new_tokens,
                                          settings.repeats))
    cache: dict[str, Any] = {}
    dense_shape = [(dims.n_heads, dims.n_kv_heads, dims.intermediate)] * dims.n_layers
    dense = write_synthetic_gguf(workdir / "dense.gguf", dims, dense_shape, settings.file_type, tokenizer_gguf,
                                 settings.seed, cache)
    ratios: dict[str, tuple[float, float]] = {}
    refs: list[Timing] = []
    for name, shapes in points.items():
        path = write_synthetic_gguf(workdir / "point.gguf", dims, shapes, settings.file_type, tokenizer_gguf,
                                    settings.seed, cache)
        ref, point = timer(dense), timer(path)
        refs.append(ref)
        ratios[name] = (point.decode_us / ref.decode_us, point.prompt_us / ref.prompt_us)
        log.info("%s: decode %.0f us (dense %.0f), prompt %.0f us/token", name, point.decode_us, ref.decode_us,
                 point.prompt_us)
        path.unlink()
    dense.unlink()
    ref_decode = statistics.median(r.decode_us for r in refs)
    ref_prompt = statistics.median(r.prompt_us for r in refs)
    out: dict[str, dict[str, Any]] = {name: {"decode_us": d * ref_decode, "prompt_us": p * ref_prompt} for name, (d, p) in ratios.items()}
    out["dense"] = {"decode_us": ref_decode, "prompt_us": ref_prompt,
                    "decode_us_spread": [min(r.decode_us for r in refs), max(r.decode_us for r in refs)]}
    return out


def grid_points(dims: ModelDims, settings: BenchSettings, checks: dict[str, Shapes] | None = None
                ) -> tuple[dict[str, Shapes], list[tuple[int, int]], list[int], list[int]]:
    """The named model shapes to time: base, one per attention shape, MLP widths, and checks."""
    L = dims.n_layers
    n_rep = dims.n_heads // dims.n_kv_heads
    attn = [(g * q, g) for g in range(1, dims.n_kv_heads + 1) for q in range(1, n_rep + 1)]
    widths, held_out = mlp_grid(dims, settings)
    points: dict[str, Shapes] = {"base": [(0, 0, 0)] * L}
    points.update({f"attn/{h}/{kv}": [(h, kv, 0)] * L for h, kv in attn})
    points.update({f"mlp/{w}": [(0, 0, w)] * L for w in [*widths, *held_out]})
    points.update(checks or {})
    return points, attn, widths, held_out


def fit_costs(dims: ModelDims, options: dict[str, list[list[int]]], times: dict[str, dict[str, Any]],
              attn: Sequence[tuple[int, int]], widths: Sequence[int], held_out: Sequence[int],
              checks: dict[str, Shapes], key: dict[str, Any]) -> RuntimeCosts:
    """Per-layer option costs from the timed points (times) and the memory formulas."""
    L, ft = dims.n_layers, key["file_type"]
    fixed = {kind: times["base"][kind] for kind in ("decode_us", "prompt_us")}

    def per_layer(name: str, kind: str) -> float:
        return max((times[name][kind] - fixed[kind]) / L, 0.0)

    def mlp_time(width: int, kind: str, measured: Sequence[int]) -> float:
        xs = [0, *measured]
        ys = [0.0, *(per_layer(f"mlp/{w}", kind) for w in measured)]
        return float(np.interp(memory.padded_width(width, ft), xs, ys))

    cost: dict[str, dict[str, np.ndarray]] = {}
    for kind in ("decode_us", "prompt_us"):
        a = np.array([per_layer(f"attn/{g * q}/{g}", kind) if g else 0.0 for g, q in options["attn"]])
        m = np.array([mlp_time(w, kind, widths) for (w,) in options["mlp"]])
        cost[kind] = {"attn": np.tile(a, (L, 1)), "mlp": np.tile(m, (L, 1))}
        cost[kind]["attn"][0, [i for i, (g, _) in enumerate(options["attn"]) if g == 0]] = per_layer("attn/1/1", kind)
    for kind, attn_fn, mlp_fn in (
        ("weight_bytes", lambda g, q: memory.attn_bytes(dims, g * q, g, ft), lambda w: memory.mlp_bytes(dims, w, ft)),
        ("kv_bytes_per_cell", lambda g, q: memory.kv_bytes_per_cell(dims, g), lambda w: 0),
    ):
        a = np.array([attn_fn(g, q) for g, q in options["attn"]], dtype=np.float64)
        cost[kind] = {"attn": np.tile(a, (L, 1)),
                      "mlp": np.tile(np.array([mlp_fn(w) for (w,) in options["mlp"]], dtype=np.float64), (L, 1))}
        cost[kind]["attn"][0, [i for i, (g, _) in enumerate(options["attn"]) if g == 0]] = attn_fn(1, 1)  # zero head
    fixed["weight_bytes"] = float(memory.fixed_bytes(dims, ft))
    fixed["kv_bytes_per_cell"] = 0.0
    held = {kind: {w: {"measured": per_layer(f"mlp/{w}", kind), "interpolated": mlp_time(w, kind, widths)}
                   for w in held_out} for kind in ("decode_us", "prompt_us")}
    checked: dict[str, Any] = {}
    fit: dict[str, Any] = {"times": times, "attn_points": [list(p) for p in attn], "mlp_widths": list(widths),
           "mlp_held_out": held, "checks": checked}
    costs = RuntimeCosts(key, dims, options, cost, fixed, fit)
    for name, shapes in checks.items():
        checked[name] = {kind: {"measured": times[name][kind], "predicted": predict_shapes(costs, shapes, kind)}
                               for kind in ("decode_us", "prompt_us")}
    checked["dense"] = {"decode_us": {"measured": times["dense"]["decode_us"], "predicted": costs.total(
        "decode_us", costs.dense_choice())}}
    return costs


def predict_shapes(costs: RuntimeCosts, shapes: Shapes, kind: str) -> float:
    """Predicted time of a model given as per-layer (n_heads, n_kv, width), through the options table."""
    dims, opts = costs.dims, costs.options
    n_rep = dims.n_heads // dims.n_kv_heads
    choice: dict[str, list[int]] = {c: [] for c in COMPONENTS}
    for h, kv, w in shapes:
        gq = [kv, h // kv if kv else 0]
        choice["attn"].append(next(i for i, o in enumerate(opts["attn"]) if list(o) == gq))
        choice["mlp"].append(int(np.argmin([abs(o[0] - w) for o in opts["mlp"]])))
    del n_rep
    return costs.total(kind, choice)


def load_or_measure(path: str | Path, key: dict[str, Any], measure: Callable[[], RuntimeCosts]) -> RuntimeCosts:
    """The cost table cached at `path` when its key matches (same machine, model, type, settings), else measured."""
    path = Path(path)
    if path.is_file():
        cached = RuntimeCosts.load(path)
        if cached.key == key:
            return cached
        log.info("cost table at %s is for another key; measuring again", path)
    costs = measure()
    path.parent.mkdir(parents=True, exist_ok=True)
    costs.save(path)
    return costs
