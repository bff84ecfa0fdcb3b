"""docs/models.md's zoo table is the zoo: a model registered in edge_sdk/models/zoo.py but missing
from the table (or described differently) fails here, with the table to paste."""

from __future__ import annotations

from pathlib import Path

import torch

from edge_sdk.models.zoo import MODEL_NAMES, build_model, model_spec
from exporters.train_export import train_graph_refusal

DOC = Path(__file__).resolve().parents[1] / "docs" / "models.md"
START, END = "<!-- zoo table:", "<!-- end of zoo table -->"
HEADER = ("| name | dataset | blocks | input (per sample) | task, outputs | parameters | width | training graph splits "
          "| description |\n|---|---|---|---|---|---|---|---|---|")


def _graph_splits(model) -> str:
    """The splits whose tail a device without torch can train, said briefly."""
    ok = [k for k in range(len(model)) if train_graph_refusal(model, k) is None]
    if not ok:
        return "none"
    if len(ok) == len(model):
        return "all"
    if ok == list(range(ok[0], len(model))):
        return f"k >= {ok[0]}"
    return ", ".join(map(str, ok))


def _row(name: str) -> str:
    spec = model_spec(name)
    with torch.device("meta"):  # shapes and counts only: no storage
        model = build_model(name, seed=None)
    dtype = str(model.input_dtype).removeprefix("torch.")
    params = sum(p.numel() for p in model.parameters())
    return (f"| `{name}` | {spec.dataset} | {len(model)} | {dtype} {list(model.input_shape)} | {model.task}, "
            f"{model.num_outputs} | {params:,} | {'yes' if spec.widths else 'no'} | {_graph_splits(model)} "
            f"| {spec.description} |")


def zoo_table() -> str:
    return "\n".join([HEADER, *(_row(name) for name in MODEL_NAMES)])


def test_the_docs_zoo_table_lists_every_zoo_model_as_it_is() -> None:
    text = DOC.read_text(encoding="utf-8")
    start = text.index(START)
    body = text[text.index("\n", start) + 1: text.index(END)].strip()
    expected = zoo_table()
    missing = [name for name in MODEL_NAMES if f"| `{name}` |" not in body]
    assert not missing, f"docs/models.md lacks {missing}; its zoo table should read:\n{expected}"
    assert body == expected, f"docs/models.md's zoo table differs from the zoo; it should read:\n{expected}"
