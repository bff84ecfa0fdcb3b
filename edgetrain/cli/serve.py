"""``edgetrain serve`` and ``edgetrain device``: the two long-running halves of a deployment.

``edgetrain device`` is the device SDK's own entry point (``python -m edge_sdk``, :mod:`edge_sdk.cli`)
with ``--device-class`` added: the budgets of device classes live on the planning side (``profiles``).
"""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import json
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

import typer

from edgetrain.cli import app
from edgetrain.cli.settings import SettingsCommand, config_from_options, config_parameters

if TYPE_CHECKING:
    from orchestrator.config import ServerConfig
    from orchestrator.strategies import Strategy


def serve(**options: Any) -> None:
    """Run the orchestrator: register devices, plan their splits, run rounds, checkpoint each one."""
    check, json_events, log_file = options.pop("check"), options.pop("json_events"), options.pop("log_file")
    web_options = {k: options.pop(k) for k in WEB_OPTIONS}
    ctx: typer.Context = options.pop("ctx")
    given = {name for name in options if ctx.get_parameter_source(name).name != "DEFAULT"}
    config, strategy = _configure(options, options.pop("strategy_option"), given)
    authority = _web_authority(config, **web_options)
    config = _with_tls(config, authority)
    if check:
        typer.echo(json.dumps({"config": config.to_dict(), "strategy": strategy.name,
                               "state": {k: repr(v) for k, v in sorted(vars(strategy).items())}}, default=str))
        return
    from edgetrain.cli import console
    from edgetrain.cli.export import record_settings
    from orchestrator.server import Orchestrator
    from orchestrator.server.evaluate import NO_EVALUATION
    from orchestrator.views.terminal import ServeOutput

    if config.eval_source.strip().lower() == NO_EVALUATION:
        typer.echo("edgetrain serve: --eval-data none: the server scores no model (no accuracy per round); "
                   "the devices' own losses are in the round events", err=True)
    from orchestrator.views.web import WebOptions
    from orchestrator.views.web.install import InstallSite

    # The local authority's plain-http install page, beside the server (it redirects to the server's port).
    install = None if authority is None else InstallSite(authority, lambda: orchestrator.port)
    output = ServeOutput(config, console(), json_events=json_events, log_file=log_file, authority=authority,
                         install=install)
    orchestrator = Orchestrator(config, on_event=output.on_event, strategy=strategy,  # refuses data the model cannot take
                                web=WebOptions(tuple(web_options["web_condition"]), authority))
    record_settings(orchestrator.store, config)  # what `edgetrain export` writes beside the model
    with output:
        if install is None:
            history = asyncio.run(orchestrator.run())
        else:
            async def run_beside_install_page() -> list[dict]:
                http_port = web_options["web_http_port"]
                async with install.serving(config.host, http_port if http_port >= 0 else config.port and config.port + 1):
                    return await orchestrator.run()

            history = asyncio.run(run_beside_install_page())
    output.finished(history)


def _configure(options: dict[str, Any], strategy_option: list[str],
               given: set[str] = frozenset()) -> tuple[ServerConfig, Strategy]:
    """The settings and the strategy the options give, built once; a bad value ends the command with
    one line naming the option, exit status 2, before anything listens. ``given``: the settings the
    command line named (a strategy's server settings leave them as given)."""
    from edgetrain.cli.settings import option_spelling
    from orchestrator.aggregation.assembly import check_capabilities
    from orchestrator.config import SettingError
    from orchestrator.strategies import make_strategy, strategy_options
    from orchestrator.strategies.server_settings import apply_server_settings

    try:
        config = config_from_options(options, strategy_options=parse_strategy_options(strategy_option))
        config.strategy_options = strategy_options(config.strategy, config.strategy_options)
        strategy = make_strategy(config.strategy, **config.strategy_options)
        try:  # what the strategy declares it can run under (Strategy.combines), against the settings
            check_capabilities(config, strategy)
        except SettingError as e:
            raise SettingError(option_spelling(e.name), e.problem) from None
        config, notes = apply_server_settings(config, given, option_spelling)
        for line in notes:  # which server defaults the strategy changes, and why
            typer.echo(f"edgetrain serve: {line}", err=True)
        config.store_dir = _store(config)
        from edge_sdk.models.zoo import model_spec

        model_spec(config.model)  # an unknown model or a factory that does not load: refused before listening
        return config, strategy
    except ValueError as e:
        typer.echo(f"edgetrain serve: {e}", err=True)
        raise typer.Exit(2) from None


#: serve's options for the device page on a LAN (docs/web.md), beside the settings of ServerConfig.
WEB_OPTIONS = ("web_tls", "web_ca", "web_http_port", "web_condition")


def _web_authority(config: ServerConfig, *, web_tls: str, web_ca: Path | None, web_http_port: int,
                   web_condition: list[str]) -> Any:
    """With ``--web`` beyond this machine (``--web-tls auto``) or ``--web-tls local-ca``: the local
    certificate authority kept in ``--web-ca`` and a certificate for this machine's addresses, which the
    port then serves TLS with (docs/web.md, "A phone on the LAN"; :func:`_with_tls`). None: the port serves as
    configured."""
    from orchestrator.views.web.site import CONDITIONS

    def fail(message: str) -> None:
        typer.echo(f"edgetrain serve: {message}", err=True)
        raise typer.Exit(2)

    if web_tls not in ("auto", "local-ca", "off"):
        fail(f"--web-tls is auto, local-ca or off, not {web_tls!r}")
    for condition in web_condition:
        if condition not in CONDITIONS:
            fail(f"--web-condition is one of {', '.join(CONDITIONS)}, not {condition!r}")
    if web_condition and not config.web:
        fail("--web-condition applies to the device page: add --web")
    if web_tls == "local-ca" and (not config.web or config.tls_cert):
        fail("--web-tls local-ca serves the device page over TLS with its own certificate: add --web, leave out "
             "--tls-cert")
    loopback = config.host in ("localhost", "::1") or config.host.startswith("127.")
    if not config.web or config.tls_cert or web_tls == "off" or (web_tls == "auto" and loopback):
        return None
    from orchestrator.views.web.certs import local_authority, machine_addresses

    return local_authority(web_ca or config.store_dir / "web-ca", machine_addresses(config.host))


def _with_tls(config: ServerConfig, authority: Any) -> ServerConfig:
    """The settings with the port serving TLS from ``authority``'s certificate (None: as they are)."""
    if authority is None:
        return config
    return dataclasses.replace(config, tls_cert=str(authority.cert_file), tls_key=str(authority.key_file))


def _store(config: ServerConfig) -> Path:
    """The store of this run. Without ``--store``, a new folder per run (``runs/serve-<time>``), so a
    second ``serve`` never meets the first one's journal; ``--resume`` continues a run, so it needs the
    ``--store`` of that run."""
    from orchestrator.config import ServerConfig

    if config.store_dir != ServerConfig.__dataclass_fields__["store_dir"].default:
        return config.store_dir
    if config.resume:
        raise ValueError("--resume continues a run: give --store, the folder of that run")
    return Path("runs") / f"serve-{time.strftime('%Y%m%d-%H%M%S')}-{os.getpid()}"


serve.__signature__ = inspect.Signature([  # type: ignore[attr-defined]
    inspect.Parameter("ctx", inspect.Parameter.KEYWORD_ONLY, annotation=typer.Context),
    *config_parameters(),
    inspect.Parameter("strategy_option", inspect.Parameter.KEYWORD_ONLY, annotation=list[str], default=typer.Option(
        [], "--strategy-option", "-O", help="KEY=VALUE option of the strategy, repeatable, typed by its constructor "
                                            "(e.g. -O epsilon=0.3 -O warmup=5 for fedalign, -O correction=false for "
                                            "fedsubavg; docs/architecture.md, \"Strategies\").")),
    inspect.Parameter("web_tls", inspect.Parameter.KEYWORD_ONLY, annotation=str, default=typer.Option(
        "auto", "--web-tls", help="With --web: local-ca serves the port over TLS with a certificate from a "
                                  "certificate authority made here and kept in --web-ca, which a phone installs "
                                  "from a plain-http page (a LAN page is a secure context only over https); auto: "
                                  "local-ca when --host reaches beyond this machine and --tls-cert is not given; "
                                  "off: never (docs/web.md).")),
    inspect.Parameter("web_ca", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path], default=typer.Option(
        None, "--web-ca", help="Folder of the local certificate authority (default: --store/web-ca); keep one "
                               "folder for all runs so that a phone installs it once.")),
    inspect.Parameter("web_http_port", inspect.Parameter.KEYWORD_ONLY, annotation=int, default=typer.Option(
        -1, "--web-http-port", help="Plain-http port of the authority's install page (default: --port + 1; 0: any "
                                    "free port).")),
    inspect.Parameter("web_condition", inspect.Parameter.KEYWORD_ONLY, annotation=list[str], default=typer.Option(
        [], "--web-condition", help="What the device page waits for before it trains, repeatable: charging, "
                                    "unmetered (where the browser tells; docs/web.md).")),
    inspect.Parameter("check", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--check", help="Check every option, print the settings and the strategy as JSON, and exit "
                               "without listening.")),
    inspect.Parameter("json_events", inspect.Parameter.KEYWORD_ONLY, annotation=bool, default=typer.Option(
        False, "--json-events", help="Print the server's events as JSON lines on standard output (for tools) "
                                     "instead of the progress a person reads.")),
    inspect.Parameter("log_file", inspect.Parameter.KEYWORD_ONLY, annotation=Optional[Path], default=typer.Option(
        None, "--log-file", help="Also append the server's events and log to this file, one JSON object a line.")),
])
app.command(cls=SettingsCommand, epilog="Examples: edgetrain serve --rounds 20 --min-devices 4; edgetrain serve --model my_app.model:make_model --eval-data holdout.npz --store runs/mine; edgetrain serve --store runs/mine --resume")(serve)


def parse_strategy_options(items: list[str]) -> dict[str, object]:
    """``KEY=VALUE`` pairs as keyword options; values stay text (typed by the strategy's constructor)."""
    options: dict[str, object] = {}
    for item in items:
        key, eq, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if not eq or not key.isidentifier():
            raise ValueError(f"--strategy-option: a strategy option is KEY=VALUE, got {item!r}")
        options[key] = value.strip()
    return options


@app.command(context_settings={"allow_extra_args": True, "ignore_unknown_options": True}, add_help_option=False)
def device(ctx: typer.Context) -> None:
    """Run one device (edgetrain device --help), or manage credentials: edgetrain device enroll|revoke|list."""
    from edge_sdk import cli as device_cli
    from profiles.devices import DeviceClassError, load_device_class

    if ctx.args and ctx.args[0] in CREDENTIAL_COMMANDS:
        credentials(ctx.args[0], ctx.args[1:])
        return

    # The device's own entry point (python -m edge_sdk), plus what only the planning side knows:
    # the budgets of device classes (--device-class).
    def class_budget(name: str) -> int:
        try:
            return load_device_class(name).budget_bytes
        except DeviceClassError as e:
            raise ValueError(str(e)) from None

    device_cli.main(ctx.args, prog="edgetrain device", device_class_budget=class_budget)


CREDENTIAL_COMMANDS = ("enroll", "revoke", "list")


def credentials(command: str, argv: list[str]) -> None:
    """``edgetrain device enroll --store DIR --id ID [--samples N] [--out FILE]``: issue a device's
    credential (its secret is printed, or written to --out, once: the store keeps only its key);
    ``revoke --store DIR --id ID``; ``list --store DIR``. The store is the server's --store folder."""
    import argparse

    from orchestrator.store import Store

    parser = argparse.ArgumentParser(prog=f"edgetrain device {command}", description=credentials.__doc__)
    parser.add_argument("--store", type=Path, required=True, help="the server's --store folder")
    if command != "list":
        parser.add_argument("--id", dest="device_id", required=True, help="the device's id")
    if command == "enroll":
        parser.add_argument("--samples", type=int, default=None,
                            help="the sample count this device's reports may weigh (default: what it declares)")
        parser.add_argument("--out", type=Path, default=None, help="write the secret to this file (mode 0600)")
    args = parser.parse_args(argv)
    with Store(args.store) as store:
        if command == "enroll":
            try:
                secret = store.credentials.enroll(args.device_id, samples=args.samples)
            except ValueError as e:
                parser.error(str(e))
            if args.out is None:
                typer.echo(secret)
            else:
                args.out.touch(mode=0o600)
                args.out.write_text(secret + "\n")
                typer.echo(f"enrolled {args.device_id}; its secret is in {args.out} (python -m edge_sdk --secret-file)",
                           err=True)
        elif command == "revoke":
            if not store.credentials.revoke(args.device_id):
                parser.error(f"{args.device_id} has no credential to revoke")
            typer.echo(f"revoked {args.device_id}", err=True)
        else:
            for c in store.credentials.all():
                state = "revoked" if c["revoked"] is not None else "active"
                typer.echo(f"{c['device_id']}\t{state}\tsamples={c['samples'] if c['samples'] else '-'}")
