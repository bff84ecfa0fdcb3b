"""Imports every command module so that each registers its commands on the app."""

# One line per command module; keep sorted.
from edgetrain.cli import bundle  # noqa: F401
from edgetrain.cli import demo  # noqa: F401
from edgetrain.cli import dp_plan  # noqa: F401
from edgetrain.cli import emulate  # noqa: F401
from edgetrain.cli import export  # noqa: F401
from edgetrain.cli import profile  # noqa: F401
from edgetrain.cli import serve  # noqa: F401
