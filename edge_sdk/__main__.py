"""``python -m edge_sdk``: run one device (see :mod:`edge_sdk.cli`)."""

from edge_sdk.cli import main

main()
