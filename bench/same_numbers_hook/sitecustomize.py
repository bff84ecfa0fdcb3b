"""Fixed randomness for ``bench/same_numbers.py``'s secure and private runs; never part of a real run.

Secure aggregation rounds each masked value stochastically (``edge_sdk.secagg.fixedpoint``: an
AES-CTR stream keyed by ``os.urandom``), and DP noise, central and distributed, is built from
``edge_sdk.dp.secure_uniform`` (``os.urandom``). Both come from the OS CSPRNG on purpose and take no
seed, so two runs of the same code give different numbers: a secure run's loss differs in its last
digits, a DP run's accuracy everywhere. A "same numbers before and after" check needs them fixed.

``bench/same_numbers.py`` puts this folder first on ``PYTHONPATH`` of the runs that need it, so Python
imports this ``sitecustomize`` at start-up in every process of the run (the emulator's workers inherit
the environment). ``SAME_NUMBERS_SEEDED`` names the modules (comma-separated) whose ``os`` is replaced,
as each is imported, by a proxy whose ``urandom(n)`` reads the next n bytes of a seeded stream (numpy's
PCG64) instead: one stream per module and per device, the device found as the ``device_id`` of the
device SDK object (a class of ``edge_sdk``) that draws, within a few frames of the call; draws made
outside a device (the server's central noise) share one stream per module and process. A device draws
in its own order (its blocks and slices one after another, round after round), and the server draws
its noise one block after another, so the bytes each gets do not depend on which device, thread or
worker process draws first, and the noise and rounding are independent across devices and rounds as
the OS's would be: repeatable, not private. Each process appends ``module<TAB>device`` to
``SAME_NUMBERS_HOOK_LOG`` when a stream starts, so the script can tell that the hook took effect and that
device draws were told apart (a module that draws its bytes some other way, or a device object without
``device_id``, would otherwise pass unnoticed, and the numbers would not repeat).

Nothing happens without ``SAME_NUMBERS_SEEDED``; another ``sitecustomize`` later on the path still runs.
"""

from __future__ import annotations

import hashlib
import importlib.abc
import importlib.machinery
import os
import sys

SEED = "edgetrain same numbers"
#: How many frames above ``urandom`` the drawing device object may be (a device's discrete Gaussian
#: noise: urandom < secure_uniform < discrete_gaussian < noise_share < the secure round's block).
DEPTH = 6


def drawing_device() -> str:
    """The ``device_id`` of the device SDK object within :data:`DEPTH` frames of ``urandom``'s caller; ''."""
    frame = sys._getframe(2)
    for _ in range(DEPTH):
        if frame is None:
            break
        owner = frame.f_locals.get("self")
        device = getattr(owner, "device_id", None) if type(owner).__module__.startswith("edge_sdk") else None
        if isinstance(device, str):
            return device
        frame = frame.f_back
    return ""


class FixedRandomOS:
    """The ``os`` module as one module sees it, but for ``urandom``: seeded streams (module docstring)."""

    def __init__(self, module: str, log: str | None) -> None:
        self._module, self._log, self._streams = module, log, {}

    def urandom(self, n: int) -> bytes:
        device = drawing_device()
        stream = self._streams.get(device)
        if stream is None:
            import numpy as np  # the fixed modules import it anyway

            key = hashlib.sha256(f"{SEED}/{self._module}/{device}".encode()).digest()
            stream = self._streams[device] = np.random.default_rng(int.from_bytes(key, "little"))
            if self._log:
                with open(self._log, "a", encoding="utf-8") as f:
                    f.write(f"{self._module}\t{device}\n")
        return stream.bytes(n)

    def __getattr__(self, name: str) -> object:
        return getattr(os, name)


class FixRandomness(importlib.abc.MetaPathFinder):
    """Finds the named modules with the finders after it, and replaces ``os`` in each once it has run."""

    def __init__(self, modules: set[str], log: str | None) -> None:
        self.modules, self.log = modules, log

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.modules:
            return None
        for finder in sys.meta_path:
            spec = None if finder is self else getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                run = spec.loader.exec_module

                def exec_module(module, run=run, name=fullname):
                    run(module)
                    module.os = FixedRandomOS(name, self.log)

                spec.loader.exec_module = exec_module
                return spec
        return None


def _install() -> None:
    modules = {m.strip() for m in os.environ.get("SAME_NUMBERS_SEEDED", "").split(",") if m.strip()}
    if modules:
        sys.meta_path.insert(0, FixRandomness(modules, os.environ.get("SAME_NUMBERS_HOOK_LOG")))


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, if any (this one shadows it)."""
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [p for p in sys.path if os.path.abspath(p or ".") != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is not None and spec.loader is not None:
        spec.loader.exec_module(type(sys)("sitecustomize"))


_install()
_chain()
