"""Fixtures shared by test modules: a virtual environment with the core install only (no torch); the
data root of the test run (tests/shared_data.py), exported as $EDGETRAIN_DATA where it exists; and the
folder the devices a test starts keep their payloads in by default ($EDGETRAIN_PAYLOAD_CACHE, removed
after the run: none is left in the user's cache)."""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10
    import tomli as tomllib  # type: ignore[no-redef]

from tests.shared_data import SHARED

ROOT = Path(__file__).resolve().parents[1]
if SHARED.is_dir():  # the test run's data root, for the library and every device process it starts
    os.environ.setdefault("EDGETRAIN_DATA", str(SHARED))
#: What `pip install .` installs (pyproject.toml's core dependencies), pinned like everything else.
CORE: list[str] = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]


def _payloads_in(folder: Path):
    """$EDGETRAIN_PAYLOAD_CACHE at ``folder`` while the fixture lasts, then as it was."""
    before = os.environ.get("EDGETRAIN_PAYLOAD_CACHE")
    os.environ["EDGETRAIN_PAYLOAD_CACHE"] = str(folder)
    yield
    if before is None:
        os.environ.pop("EDGETRAIN_PAYLOAD_CACHE", None)
    else:
        os.environ["EDGETRAIN_PAYLOAD_CACHE"] = before
    shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture(autouse=True, scope="session")
def _session_payload_cache(tmp_path_factory: pytest.TempPathFactory):
    """The run's folder for them (session fixtures): none is left in the user's cache."""
    yield from _payloads_in(tmp_path_factory.mktemp("payloads"))


@pytest.fixture(autouse=True, scope="module")
def _module_payload_cache(_session_payload_cache, tmp_path_factory: pytest.TempPathFactory):
    """Where the devices' default payload-cache folders go (one per server address and device id) for a
    module's fixtures: a folder of the module's own, since a port freed by one test's server may be the
    next one's, and a device of the same id would then find the earlier run's payloads held."""
    yield from _payloads_in(tmp_path_factory.mktemp("payloads"))


@pytest.fixture(autouse=True)
def _payload_cache(_module_payload_cache, tmp_path_factory: pytest.TempPathFactory):
    """The same for each test: a folder of its own."""
    yield from _payloads_in(tmp_path_factory.mktemp("payloads"))


def _digits_csv() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("sklearn")
    assert spec is not None and spec.submodule_search_locations
    return Path(list(spec.submodule_search_locations)[0]) / "datasets" / "data" / "digits.csv.gz"


@pytest.fixture(scope="session")
def no_torch_python(request: pytest.FixtureRequest) -> str:
    """A venv with the core dependencies and the project (--no-deps), built once and kept in
    pytest's cache; a lock keeps parallel test workers from building it twice."""
    base = request.config.cache.mkdir("edgetrain-venv-no-torch")
    venv, stamp = base / "venv", base / "ready"
    python = venv / "bin" / "python"
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not stamp.exists():
            shutil.rmtree(venv, ignore_errors=True)
            subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
            pip = [str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
            subprocess.run([*pip, "-c", str(ROOT / "constraints.txt"), *CORE], check=True)
            subprocess.run([*pip, "--no-deps", str(ROOT)], check=True)
            # The digits CSV that ships inside scikit-learn, where the loader looks for it (a
            # namespace folder named sklearn holding only the data file, none of its code).
            purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
                                     check=True, capture_output=True, text=True).stdout.strip()
            target = Path(purelib) / "sklearn" / "datasets" / "data"
            target.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(_digits_csv(), target / "digits.csv.gz")
            stamp.write_text("ok\n")
    probe = subprocess.run([str(python), "-c", "import importlib.util as u; print(u.find_spec('torch') is None)"],
                           check=True, capture_output=True, text=True, cwd="/")
    assert probe.stdout.strip() == "True", "the venv has torch"
    return str(python)



@pytest.fixture(scope="session")
def no_torch_pillow_python(no_torch_python: str, request: pytest.FixtureRequest) -> str:
    """The core venv with Pillow added (the optional extra an image folder needs), still without torch."""
    base = request.config.cache.mkdir("edgetrain-venv-no-torch")
    with open(base / "lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (base / "pillow").exists():
            subprocess.run([no_torch_python, "-m", "pip", "install", "--quiet", "--disable-pip-version-check",
                            "-c", str(ROOT / "constraints.txt"), "pillow"], check=True)
            (base / "pillow").write_text("ok\n")
    return no_torch_python
