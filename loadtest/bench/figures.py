"""The benchmarks' plots: matplotlib where installed (the JSON holds every figure either way)."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Optional


def pyplot() -> Optional[Any]:
    """matplotlib.pyplot on the Agg backend (no display), or None when matplotlib is missing."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    return plt


def save(fig: Any, path: Path) -> Path:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    import matplotlib.pyplot as plt

    plt.close(fig)
    return path
