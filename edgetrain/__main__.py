"""``python -m edgetrain``: the same as the ``edgetrain`` script."""

from edgetrain.cli import main

main()
