"""Credentials for emulated devices: each one enrolled in the run's own store, its secret handed to it.

A server that requires credentials (``require_credentials``) admits only a device proving its own
enrolled secret, and a secure-aggregation round (``secure_aggregation``) needs one more: the device
signs its key advertisement with the identity key derived from that secret, which the server checks
against the identity key its enrolment recorded. An emulated fleet is enrolled as an operator
enrolls real devices (``edgetrain device enroll``): :meth:`orchestrator.store.credentials.Credentials.enroll`
in the run's store, which keeps its credential's key and identity key, before the orchestrator starts.

A secret reaches its device inside the launch (:attr:`~emulator.launch.DeviceLaunch.secret`,
never shown by its ``repr``): a lightweight worker reads it from its spec file, a device process from
a launch file (:func:`~emulator.launch.device_argv`), each written by
:func:`edge_sdk.fileio.atomic_write`, whose files are created mode 0600, in the run's directory. It
is never put on a command line or in an event.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from emulator.launch import DeviceLaunch
from orchestrator.config import ServerConfig

__all__ = ["enroll_devices", "needs_credentials", "with_secrets"]


def needs_credentials(config: ServerConfig) -> bool:
    """Whether the run's devices must hold credentials: the server requires them, or runs secure rounds."""
    return bool(config.require_credentials or config.secure_aggregation)


def enroll_devices(config: ServerConfig, device_ids: Iterable[str]) -> dict[str, str]:
    """Enroll every device in the store of `config` (replacing an earlier credential, as a resumed run
    re-enrolls its fleet), its identity key with it; device id -> its secret."""
    from orchestrator.store import Store

    config.store_dir.mkdir(parents=True, exist_ok=True)
    with Store(config.store_dir) as store:
        secrets = {d: store.credentials.enroll(d) for d in device_ids}
    return secrets


def with_secrets(config: ServerConfig, launches: Mapping[str, DeviceLaunch]) -> dict[str, DeviceLaunch]:
    """The launches as they start under `config`: each with its new secret where the server needs
    credentials, unchanged otherwise."""
    if not needs_credentials(config):
        return dict(launches)
    secrets = enroll_devices(config, launches)
    return {d: dataclasses.replace(launch, secret=secrets[d]) for d, launch in launches.items()}
