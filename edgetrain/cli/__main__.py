"""``python -m orchestrator.cli``: the same as the ``edgetrain`` script."""

from orchestrator.cli import main

main()
