"""Imports every command module so that each registers its commands on the app."""

# One line per command module; keep sorted.
from orchestrator.cli import bundle  # noqa: F401
from orchestrator.cli import demo  # noqa: F401
from orchestrator.cli import dp_plan  # noqa: F401
from orchestrator.cli import emulate  # noqa: F401
from orchestrator.cli import export  # noqa: F401
from orchestrator.cli import profile  # noqa: F401
from orchestrator.cli import serve  # noqa: F401
