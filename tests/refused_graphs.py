"""A training-graph folder in which one split's graph is refused: the shared export cache linked in,
and a refusal recorded as a failed export check leaves one. Tests of what the planner and `edgetrain
bundle` do with a refused graph use it now that every zoo split passes the check."""

from __future__ import annotations

from pathlib import Path

from edge_sdk.models import build_model
from exporters.train_export import TrainGraphCache


def graphs_refusing(shared: Path, out: Path, model: str, split: int, *, exported: tuple[int, ...] = ()) -> Path:
    """``out`` holding links to ``shared``'s exported graphs and a refusal of ``model``'s ``split``;
    the ``exported`` splits of ``model`` are exported into ``shared`` first where they are not there
    yet (the test that needs them pays for the export once, and the shared cache keeps it)."""
    if exported:
        built, cache = build_model(model, seed=0), TrainGraphCache(shared)
        for k in exported:
            cache.get_or_export(built, k)
    out.mkdir(parents=True, exist_ok=True)
    for f in shared.iterdir():
        if f.suffix in (".graph", ".sha256"):
            (out / f.name).symlink_to(f)
    gid = TrainGraphCache(out).graph_id(build_model(model, seed=0), split)
    (out / f"{gid}.refused").write_text(f"{model} tail [{split}, ...): the training graph differs from torch "
                                        "autograd; worst tensor 'grad:blocks.stem.conv.weight' (a refusal "
                                        "recorded by the test)")
    return out
