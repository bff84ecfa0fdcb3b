"""A device without torch is never planned at a split whose training graph the export check refuses:
the server plans it at the largest split whose graph exports and verifies, and ships that graph.

ResNet20's whole-model graph passes the check (tests/test_train_export.py), so these tests record
a refusal for it in their own graph folder, as a check that refused it would have left."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from edge_sdk import protocol as p
from edge_sdk.ort_trainer import OrtTail, TrainGraph
from edge_sdk.wire_codecs import CODEC_META, decode_payload
from exporters.onnx_export import ExportError
from exporters.train_export import TrainGraphCache
from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator
from orchestrator.strategies.selection import Selection
from profiles.planner import plan_split
from tests.refused_graphs import graphs_refusing

STRONG = 8 << 30  # room for the whole model on either backend


@pytest.fixture(scope="module")
def graph_dir(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The training graphs tests/test_train_export.py exports (linked from its cache: exported once
    per machine), and a refusal recorded for ResNet20's stem split (0)."""
    shared = Path(request.config.cache.mkdir("edgetrain-train-graphs"))
    return graphs_refusing(shared, tmp_path_factory.mktemp("train-graphs"), "resnet20", 0)


def _server(tmp_path: Path, graph_dir: Path) -> Orchestrator:
    config = ServerConfig(model="resnet20", eval_source="none", store_dir=tmp_path / "store",
                          train_graph_dir=graph_dir)
    return Orchestrator(config)


def _hello(runtimes: list[str], budget: int = STRONG) -> p.Hello:
    return p.Hello(device_id="d1", token="", budget_bytes=budget, cores=2, runtimes=runtimes, num_samples=2_000)


@pytest.mark.slow  # exports ResNet20's split 1 (about 40 s on 2 cores), whose own case is in the slow tier too
def test_torchless_resnet20_gets_the_largest_split_with_a_shippable_graph(request: pytest.FixtureRequest,
                                                                          tmp_path: Path) -> None:
    # Split 1, the one the planner falls back to, exported into the shared cache (where
    # tests/test_train_export.py finds it) and linked beside the stem's refusal.
    shared = Path(request.config.cache.mkdir("edgetrain-train-graphs"))
    graph_dir = graphs_refusing(shared, tmp_path / "train-graphs", "resnet20", 0, exported=(1,))
    server = _server(tmp_path, graph_dir)
    events: list[tuple[str, dict]] = []
    server.on_event = lambda kind, data: events.append((kind, data))
    hello = _hello(["onnxruntime"])
    # What the planner alone picks for this budget: the stem, whose graph the export check refuses.
    assert plan_split(server.cost, STRONG, 32, local_samples=2_000, backends=("onnxruntime",),
                      graph_splits=frozenset(range(len(server.model)))).split == 0
    with pytest.raises(ExportError, match="stem"):
        TrainGraphCache(graph_dir).get_or_export(server.model, 0)

    plan = asyncio.run(server.shippable_plan(hello))
    assert plan.backend == "onnxruntime"
    assert plan.split == 1  # the largest suffix after the refused stem
    assert 0 not in server.graph_splits
    # The graph it names is the one the round ships (the cache holds only graphs that passed the
    # export check against torch autograd), and ONNX Runtime opens it.
    gid = server.payloads.train_graph(Selection.tail(plan.split))
    assert gid == server.train_graphs.graph_id(server.model, 1) and server.payloads[gid].kind == "train_graph"
    shipped = server.payloads[gid]
    data = decode_payload(shipped.data, str(shipped.meta.get(CODEC_META, "none")), shipped.kind)  # as the device reads it
    graph = TrainGraph.from_bytes(data)
    assert (graph.model, graph.split) == ("resnet20", 1)
    OrtTail(graph)  # ONNX Runtime opens both graphs

    # A device that also has torch still trains the whole model, with torch.
    both = asyncio.run(server.shippable_plan(_hello(["torch", "onnxruntime"])))
    assert (both.split, both.backend) == (0, "torch")
    # A later server starts from the remembered refusal (no export at all).
    again = _server(tmp_path / "again", graph_dir)
    assert 0 not in again.graph_splits
    assert asyncio.run(again.shippable_plan(hello)).split == 1
    assert again.train_graphs.exports == 0


def test_a_forced_split_with_a_refused_graph_is_a_clean_refusal(tmp_path: Path, graph_dir: Path) -> None:
    server = _server(tmp_path, graph_dir)
    server.config.allow_forced_split = True
    hello = _hello(["onnxruntime"])
    hello.labels["force_split"] = "0"
    with pytest.raises(p.ProtocolError) as caught:
        asyncio.run(server.shippable_plan(hello))
    assert caught.value.code == "refused" and "no training graph" in caught.value.message
    # A strategy asking a planned device for the refused stem skips that device, never crashes the round.
    assert server.payloads.train_graph(Selection.tail(0)) is None

