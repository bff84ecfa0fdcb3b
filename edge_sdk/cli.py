"""``python -m edge_sdk``: a device, from a one-off run to a service on a board.

The device's own entry point ships with the device SDK and imports nothing outside it (typer, the
command-line library of every ``edgetrain`` command, loads only when a command line is parsed).
``edgetrain device`` runs the same command with ``--device-class`` added (the budgets of device
classes live on the planning side). Every option is also a key of the ``--config`` file, both
generated from the one declaration of the device's settings (:mod:`edge_sdk.settings`);
``--print-settings`` prints them resolved, as JSON keyed by the key table's keys, and exits. The
device keeps running (reconnecting with backoff, waiting for the next run) unless ``--once``;
``python -m edge_sdk install-service`` writes its systemd unit.

Errors a user can fix print one line and exit non-zero: 2 for a bad option, config file or data
source, 3 when the server refuses the device, 1 for the rest; ``--debug`` adds the traceback.
"""

from __future__ import annotations

import asyncio
import json
import logging
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["EXIT_REFUSED", "EXIT_USAGE", "device_config", "event_printer", "load_shard", "local_data", "main",
           "partition_indices"]

#: Exit status of a wrong option, config file or data source (restarting will not help).
EXIT_USAGE = 2
#: Exit status when the server refuses the device (bad credential, budget too small): final too.
EXIT_REFUSED = 3

EXAMPLES = """Examples:

  {prog} --server ws://10.0.0.2:8765 --id board-7 --budget 300MiB --data ./samples.csv

  {prog} --config /etc/edgetrain/device.toml

  {prog} install-service --config /etc/edgetrain/device.toml --user edgetrain
"""

class UsageProblem(ValueError):
    """A setting that does not work, named as the user gave it (exit status 2)."""


def _bundle(path: str | None) -> Path | None:
    """``--bundle``, checked before any connection (a damaged or missing bundle is a usage error)."""
    if not path:
        return None
    from edge_sdk.bundle import BundleError, load_bundle

    try:
        load_bundle(path)
    except BundleError as e:
        raise UsageProblem(f"--bundle: {e}") from None
    return Path(path)


def _read_secret(path: str) -> str:
    """The credential in ``path`` (surrounding whitespace dropped), or "" without one."""
    if not path:
        return ""
    try:
        secret = Path(path).read_text().strip()
    except OSError as e:
        raise UsageProblem(f"--secret-file: cannot read {path}: {e.strerror or e}") from None
    if not secret:
        raise UsageProblem(f"--secret-file: {path} holds no credential")
    return secret


def partition_indices(dataset, partition: str, num_clients: int, seed: int) -> list[np.ndarray]:
    """Every device's sample indices in ``dataset`` (an ``edge_sdk.data.Dataset``): the same split
    on every device that uses the same partition, count and seed."""
    from edge_sdk.data import parse_partition, partition as split_data

    scheme, alpha = parse_partition(partition)
    labels = dataset.groups if scheme == "natural" else dataset.y
    return split_data(labels, num_clients, scheme, alpha=alpha, seed=seed)


def load_shard(data: str, *, client: int, num_clients: int, partition: str = "iid", seed: int = 0,
               data_root: str | None = None, data_limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """This device's share of a research dataset's training split, copied out of a memory-mapped
    copy (the device never holds the whole dataset). ValueError for a client outside the partition."""
    from edge_sdk.data import load_dataset

    dataset = load_dataset(data, root=Path(data_root) if data_root else None, split="train", limit=data_limit,
                           mmap=True)
    parts = partition_indices(dataset, partition, num_clients, seed)
    if not 0 <= client < len(parts):
        raise ValueError(f"client {client} outside [0, {len(parts)})")
    idx = parts[client]
    return np.asarray(dataset.x[idx]), np.asarray(dataset.y[idx])


def _from_function(spec: str):
    """``package.module:function``: the function's return value (a source, arrays, or batches)."""
    import importlib

    module, _, name = spec.partition(":")
    try:
        fn = getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise UsageProblem(f"--data: cannot load {spec}: {e}") from None
    return fn() if callable(fn) else fn


def local_data(s: Any):
    """The device's data source as the settings name it (``--data``): a research dataset's share,
    an image folder, a table, or what ``package.module:function`` returns. Called again for each
    run, so data that arrived since is trained in the next one."""
    from edge_sdk.data import DATASET_NAMES, DatasetUnavailable
    from edge_sdk.data.sources import (TABLE_SUFFIXES, ArraySource, DataSourceError, ImageFolderSource,
                                       TabularSource, as_source)

    data = s.data
    try:
        if data in DATASET_NAMES:
            try:
                x, y = load_shard(data, client=s.client, num_clients=s.num_clients, partition=s.partition,
                                  seed=s.seed, data_root=s.data_root or None, data_limit=s.data_limit)
            except DatasetUnavailable as e:
                raise UsageProblem(f"--data {data}: {e}") from None
            except ValueError as e:
                raise UsageProblem(f"--data {data}: {e} (see --client, --num-clients, --partition)") from None
            return ArraySource(x, y)
        path = Path(data)
        if path.is_dir():
            size = tuple(int(v) for v in s.image_size.split("x")) if s.image_size else None
            return ImageFolderSource(path, size=size, mode=s.image_mode, flatten=s.flatten)  # type: ignore[arg-type]
        if path.suffix.lower() in TABLE_SUFFIXES:
            return TabularSource(path, label_column=s.label_column)
        if ":" in data and not path.exists():
            return as_source(_from_function(data))
    except DataSourceError as e:
        raise UsageProblem(f"--data: {e}") from None
    raise UsageProblem(f"--data: {data!r} is neither a folder of images, a {'/'.join(TABLE_SUFFIXES)} file, "
                       f"package.module:function nor a dataset ({', '.join(DATASET_NAMES)})")


def event_printer(json_events: bool) -> Callable[[str, dict], None]:
    """Events as JSON lines on stdout (for a supervisor), or readable lines on stderr."""
    from edge_sdk.logs import describe

    def on_event(kind: str, payload: dict) -> None:
        if json_events:
            print(json.dumps({"event": kind, **payload}, default=str), flush=True)
        else:
            print(describe(kind, payload), file=sys.stderr, flush=True)

    return on_event


def device_config(s: Any, *, budget_bytes: int | None = None):
    """The settings as the client runs them (:meth:`DeviceSettings.resolved
    <edge_sdk.settings.DeviceSettings.resolved>`): the budget is ``--budget``, else ``budget_bytes``
    (a device class's), else what this machine offers; the credential read from ``--secret-file``,
    the bundle checked, the registry loaded and private heat built, each refused here, before any
    connection, with the option that names it (:class:`UsageProblem`)."""
    import dataclasses

    budget = s.budget_bytes if s.budget_bytes is not None else budget_bytes
    s = dataclasses.replace(s, budget_bytes=budget, secret=_read_secret(s.secret_file), bundle=_bundle(s.bundle))
    try:
        return s.resolved()
    except ValueError as exc:
        raise UsageProblem(str(exc)) from None


def _parse(argv: Sequence[str], prog: str, wrapper: bool) -> tuple[dict[str, Any] | None, str | None, bool]:
    """The command line's values by setting name (None: not given), ``--config`` and
    ``--print-settings``; (None, None, False) after ``--help``. A usage error raises :class:`UsageProblem`."""
    import inspect
    from typing import List, Optional

    import typer

    from edge_sdk.settings import option_flag, setting_choices, setting_kind, settings_fields

    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("config", kw, annotation=Optional[str], default=typer.Option(
        None, "--config", metavar="FILE", help="TOML file of settings: every option below without its dashes "
                                               "(data-root = \"/data\"); options given here win")),
              inspect.Parameter("print_settings", kw, annotation=Optional[bool], default=typer.Option(
        None, "--print-settings", metavar="", help="print the resolved settings as one JSON object (keyed by the "
                                                   "config file's keys) and exit"))]
    for f in settings_fields(wrapper=wrapper, sdk="python"):
        kind, choices = setting_kind(f), setting_choices(f)
        annotation = Optional[bool] if kind == "bool" else Optional[List[str]] if kind == "list" else Optional[str]
        default = f" (default: {f.default})" if f.default not in (None, "", False) and kind != "list" else ""
        metavar = f.metadata["metavar"] or "|".join(choices) or ("" if kind == "bool" else kind.upper())
        params.append(inspect.Parameter(f.name, kw, annotation=annotation, default=typer.Option(
            None, option_flag(f), help=f.metadata["help"] + default, metavar=metavar)))
    seen: dict[str, Any] = {}

    def device(**values: Any) -> None:
        seen.update(values)

    device.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    device.__doc__ = ("Run a device: say hello to the server, train its share each round, reconnect when the "
                      "connection drops, and wait for the next run when one ends.")
    app = typer.Typer(add_completion=False)
    app.command(epilog=EXAMPLES.format(prog=prog))(device)
    try:
        typer.main.get_command(app).main(args=list(argv), prog_name=prog, standalone_mode=False)
    except typer.TyperException as e:
        message = e.format_message() if hasattr(e, "format_message") else str(e)
        raise UsageProblem(f"{message} (see {prog} --help)") from None
    if not seen:
        return None, None, False
    config, print_settings = seen.pop("config"), seen.pop("print_settings")
    return seen, config, bool(print_settings)


def _fail(message: str, status: int) -> int:
    print(f"error: {message}", file=sys.stderr, flush=True)
    return status


def main(argv: Sequence[str] | None = None, *, prog: str = "python -m edge_sdk",
         device_class_budget: Callable[[str], int] | None = None) -> None:
    """Run the device command (or ``install-service``) and exit with its status.

    ``device_class_budget`` (given by ``edgetrain device``) adds ``--device-class``: the budget of a
    named device class, raising ValueError for an unknown one."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["install-service"]:
        from edge_sdk.systemd import install_service

        raise SystemExit(install_service(argv[1:], prog=f"{prog} install-service"))
    debug = "--debug" in argv
    try:
        status = _device(argv, prog, device_class_budget)
    except KeyboardInterrupt:
        status = 130
    except Exception as e:
        if debug:
            raise
        from edge_sdk.client import DeviceRefused

        if isinstance(e, DeviceRefused):
            status = _fail(f"the server refused this device: {e}", EXIT_REFUSED)
        elif isinstance(e, UsageProblem):
            status = _fail(str(e), EXIT_USAGE)
        else:
            status = _fail(f"{str(e).splitlines()[0] if str(e) else type(e).__name__} "
                           "(--debug shows the traceback)", 1)
    raise SystemExit(status)


def _device(argv: list[str], prog: str, device_class_budget: Callable[[str], int] | None) -> int:
    from edge_sdk.settings import SettingError, load_settings, settings_json

    given, config, print_settings = _parse(argv, prog, wrapper=device_class_budget is not None)
    if given is None:
        return 0
    try:
        s = load_settings(given, config)
    except SettingError as e:
        raise UsageProblem(str(e)) from None
    if print_settings:
        print(json.dumps(settings_json(s), indent=2))
        return 0
    from edge_sdk.logs import configure_logging, event_logger

    try:
        configure_logging(s.log_format, s.log_file, s.log_level)
    except OSError as e:
        raise UsageProblem(f"--log-file: cannot write {s.log_file}: {e.strerror or e}") from None
    budget = None
    if s.device_class and s.budget_bytes is None and device_class_budget is not None:
        try:
            budget = device_class_budget(s.device_class)
        except ValueError as e:
            raise UsageProblem(f"--device-class: {e}") from None
    on_event = event_printer(True) if s.json_events else event_logger()
    config_ = device_config(s, budget_bytes=budget)
    first = [local_data(s)]  # a data source that does not work fails here, before any connection

    from edge_sdk.client import DeviceClient
    from edge_sdk.service import run_service

    def client() -> DeviceClient:
        return DeviceClient(config_, first.pop() if first else local_data(s), on_event=on_event)

    asyncio.run(run_service(client, once=s.once, max_delay_s=s.reconnect_max_delay, on_event=on_event))
    logging.getLogger("edgetrain.device").info("stopped")
    return 0
