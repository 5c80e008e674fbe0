"""PNG plots of a plan: kept fraction per layer, and the ΔL table as a heat map (needs matplotlib)."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from gapprune.allocate.table import LossTable
from gapprune.pruning.plan import Plan


def _pyplot():  # type: ignore[no-untyped-def]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as err:
        raise ImportError("plots need matplotlib: pip install 'gapprune[plots]'") from err
    return plt


def plot_kept_fraction(plan: Plan, path: str | Path, title: str = "") -> None:
    """Bar chart of the fraction of parameters kept per layer, attention and MLP side by side."""
    plt = _pyplot()
    layers = np.arange(len(plan.layers))
    attn = [lp.attn.params_after / lp.attn.params_before for lp in plan.layers]
    mlp = [lp.mlp.params_after / lp.mlp.params_before for lp in plan.layers]
    fig, ax = plt.subplots(figsize=(max(6, len(layers) * 0.3), 3.5))
    ax.bar(layers - 0.2, attn, width=0.4, label="attention")
    ax.bar(layers + 0.2, mlp, width=0.4, label="MLP")
    ax.set_xlabel("layer")
    ax.set_ylabel("fraction of parameters kept")
    ax.set_ylim(0, 1.05)
    ax.set_title(title or "kept fraction per layer")
    ax.legend(loc="lower right")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def plot_loss_table(table: LossTable, path: str | Path) -> None:
    """Heat maps of log10(ΔL) per layer (rows) and option (columns), one panel per component."""
    plt = _pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, max(3.5, table.n_layers * 0.18)))
    for ax, component in zip(axes, ("attn", "mlp")):
        values = np.log10(np.clip(table.loss[component], 1e-6, None))
        image = ax.imshow(values, aspect="auto", cmap="viridis")
        ax.set_title(f"{component}: log10 ΔL ({table.metric})")
        ax.set_xlabel("option (more removed →)")
        ax.set_ylabel("layer")
        fig.colorbar(image, ax=ax)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)
