"""``edgetrain export --store DIR``: the model a run committed, in the forms an app ships.

For the last completed round of the run in ``--store`` (or ``--round N``, while the store still
keeps that round's checkpoint), it writes into ``--out`` (default ``<store>/exports/round-<N>/``):

- ``model.onnx``: the whole model for inference (``exporters.model_export``: dynamic batch,
  self-contained, checked against torch), with the metadata below in its ``metadata_props``;
- ``model.pt``: the weights as a torch state dict (``torch.load(path, weights_only=True)``, then
  ``build_model(name).load_state_dict``);
- ``model.json``: the metadata.

The metadata says what the model is and how it came to be: the round; the server's evaluation of
that round, from the journal (accuracy, loss, how many held-out samples, on which data); the
settings it was trained under (model, strategy and its options, rounds, learning rate and the
other training settings, the fleet of an emulated run); and ``privacy``, the differential-privacy
spend (epsilon at delta) recorded in that round's journal entry when the run kept a privacy
ledger, else null (the model then carries no differential-privacy guarantee). The settings are
those ``edgetrain serve`` records in the journal (:func:`record_settings`), else those of the run
report beside the store (``metrics.json`` of ``edgetrain emulate`` and ``demo``), else the model,
strategy and seed every store holds; ``settings_source`` says which.
"""

from __future__ import annotations

import io
import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from edgetrain.cli import app

if TYPE_CHECKING:
    from edge_sdk.models.layered import LayeredModel
    from orchestrator.config import ServerConfig
    from orchestrator.store import Store

__all__ = ["FORMAT", "PRIVACY", "SETTINGS_META", "model_metadata", "record_settings", "run_settings"]

#: What the metadata is (bumped when a field changes meaning).
FORMAT = "edgetrain-model/1"
#: The journal's metadata key of the settings a server ran with (:func:`record_settings`).
SETTINGS_META = "settings"
#: The key of a round's metrics (and of the model's metadata) holding the privacy ledger's spend
#: after that round: a mapping with at least ``epsilon`` and ``delta``.
PRIVACY = "privacy"
#: The server's evaluation of a round, as its journal entry holds it (orchestrator.server.evaluate).
EVALUATION = ("accuracy", "test_loss", "test_samples")
#: The run settings a model's metadata carries: what it was trained under, never where it listened
#: or its secrets. ``TRAINING_SETTINGS`` is added to these (the settings a fleet file may give).
IDENTITY = ("model", "strategy", "strategy_options", "seed", "min_devices", "eval_data", "eval_limit")


def run_settings(config: Mapping[str, Any]) -> dict[str, Any]:
    """The settings of ``config`` (``ServerConfig.to_dict()``) that a model's metadata carries."""
    from orchestrator.config import TRAINING_SETTINGS

    return {k: config[k] for k in dict.fromkeys((*IDENTITY, *TRAINING_SETTINGS)) if k in config}


def record_settings(store: Store, config: ServerConfig) -> None:
    """Keep the run's settings in its journal, for the models exported from it."""
    store.meta.record(SETTINGS_META, run_settings(config.to_dict()))


@app.command(epilog="Examples: edgetrain export --store runs/serve-20261127-101500-4242; "
                    "edgetrain export --store runs/20261127-101500 --round 3 --out app/model")
def export(
    store: Path = typer.Option(..., "--store", help="The run's store (serve's --store; for an emulate or demo run, "
                                                    "its folder or the store/ in it)."),
    round: Optional[int] = typer.Option(None, "--round", help="The round whose model to export (default: the last "
                                                              "completed round; an earlier one while the store "
                                                              "keeps its checkpoint)."),
    out: Optional[Path] = typer.Option(None, "--out", help="Folder to write model.onnx, model.pt and model.json "
                                                           "(default: STORE/exports/round-N)."),
    exporter: str = typer.Option("legacy", help="ONNX exporter: legacy (fast) or dynamo."),
) -> None:
    """Write a run's trained model as ONNX (for inference in an app) and a torch state dict, with its metadata."""
    from edgetrain.cli import console as wide_console
    from exporters.model_export import export_model
    from exporters.onnx_export import ExportSettings
    from orchestrator.store import Store

    if round is not None and round < 1:
        raise typer.BadParameter("must be at least 1", param_hint="--round")
    settings = ExportSettings(exporter=exporter)
    directory = _store_dir(store)
    with Store.open_readonly(directory) as journal:
        chosen = journal.rounds.completed() if round is None else round
        if chosen < 1:
            raise ValueError(f"{directory} holds no completed round yet: there is no trained model to export")
        state = journal.checkpoints.read(chosen)
        metadata = model_metadata(journal, directory, chosen)
    model = _model_at(str(metadata["model"]), state)
    metadata.update(_io(model))
    exported = export_model(model, metadata, settings=settings, version=chosen)
    folder = out if out is not None else directory / "exports" / f"round-{chosen:06d}"
    _write(folder, exported.onnx, model, metadata)
    wide_console().print(_summary(folder, metadata, len(exported.onnx), exported.max_abs_diff), markup=False,
                              soft_wrap=True)


def _store_dir(given: Path) -> Path:
    """The store folder: ``given``, or the ``store/`` inside a run folder of emulate or demo."""
    from orchestrator.store import JOURNAL

    for folder in (given, given / "store"):
        if (folder / JOURNAL).is_file():
            return folder
    raise FileNotFoundError(f"{given} holds no run (no {JOURNAL} in it or in {given / 'store'})")


def model_metadata(store: Store, directory: Path, round: int) -> dict[str, Any]:
    """What a model exported from round ``round`` of the run in ``store`` carries (see the module doc)."""
    row = next(r for r in store.rounds.all() if r["round"] == round)
    metrics = row["metrics"] or {}
    settings, fleet, source = _settings(store, directory)
    scored = {k: metrics[k] for k in EVALUATION if k in metrics}
    evaluation = None
    if scored:
        evaluation = {**scored, "data": settings.get("eval_source") or settings.get("eval_data")}
    privacy = metrics.get(PRIVACY)
    return {
        "format": FORMAT, "model": settings["model"], "round": round, "rounds_completed": store.rounds.completed(),
        "evaluation": evaluation, "settings": settings, "settings_source": source, "fleet": fleet,
        PRIVACY: privacy if isinstance(privacy, Mapping) and {"epsilon", "delta"} <= privacy.keys() else None,
        "checkpoint_sha256": row["sha256"],
    }


def _settings(store: Store, directory: Path) -> tuple[dict[str, Any], dict[str, Any] | None, str]:
    """The run's settings, its fleet (emulated runs) and where they were read."""
    recorded = store.meta.get(SETTINGS_META)
    if isinstance(recorded, dict):
        return recorded, None, "journal"
    report = directory.parent / "metrics.json"  # edgetrain emulate and demo: <run>/store beside <run>/metrics.json
    if report.is_file():
        run = json.loads(report.read_text())
        config = run.get("config") or {}
        if Path(str(config.get("store_dir", ""))).parts[-2:] == directory.resolve().parts[-2:]:
            fleet = {"name": run["fleet"], "file": run.get("fleet_file")} if run.get("fleet") else None
            return run_settings(config), fleet, "metrics.json"
    identity = {k: store.meta.get(k) for k in ("model", "strategy", "seed")}
    if identity["model"] is None:
        raise ValueError(f"{directory}: the journal does not say which model the run trained")
    return identity, None, "journal (model, strategy and seed only)"


def _model_at(name: str, state: Mapping[str, Any]) -> LayeredModel:
    """Model ``name`` holding the checkpoint's weights, in eval mode."""
    import torch

    from edge_sdk.models import build_model

    model = build_model(name, seed=None)
    try:
        model.load_state_dict({k: torch.from_numpy(v.copy()) for k, v in state.items()})
    except RuntimeError as e:  # a model of one's own whose code changed since the run
        raise ValueError(f"the checkpoint does not fit model {name} as it is built now: {e}") from None
    return model.eval()


def _io(model: LayeredModel) -> dict[str, Any]:
    """What an app feeds the model and gets back."""
    from exporters.model_export import INPUT_NAME, OUTPUT_NAME
    from exporters.onnx_export import chunk_io
    from orchestrator.server.evaluate import model_classes

    shapes = chunk_io(model, 0, len(model))
    return {"input": {"name": INPUT_NAME, "shape": ["batch", *shapes.input_shape], "dtype": shapes.input_dtype},
            "output": {"name": OUTPUT_NAME, "shape": ["batch", *shapes.output_shape], "dtype": shapes.output_dtype,
                       "task": model.task, "classes": model_classes(model)}}


def _write(folder: Path, onnx_bytes: bytes, model: LayeredModel, metadata: Mapping[str, Any]) -> None:
    import torch

    from edge_sdk.fileio import atomic_write

    folder.mkdir(parents=True, exist_ok=True)
    weights = io.BytesIO()
    torch.save(model.state_dict(), weights)
    atomic_write(folder / "model.onnx", onnx_bytes)
    atomic_write(folder / "model.pt", weights.getbuffer())
    atomic_write(folder / "model.json", (json.dumps(metadata, indent=2, sort_keys=True) + "\n").encode())


def _summary(folder: Path, metadata: Mapping[str, Any], size: int, diff: float) -> str:
    scored = metadata["evaluation"] or {}
    score = (f", accuracy {scored['accuracy']:.4f}" if "accuracy" in scored else "") + \
            (f", loss {scored['test_loss']:.4f}" if "test_loss" in scored else "") + \
            (f" on {scored['data']}" if scored.get("data") else "")
    return (f"{metadata['model']} after round {metadata['round']} of {metadata['rounds_completed']}{score}\n"
            f"wrote {folder / 'model.onnx'} ({size / 2**20:.1f} MiB; ONNX Runtime within {diff:.1e} of torch), "
            f"model.pt and model.json")
