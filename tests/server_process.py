"""A real server process for kill -9 tests: ``python tests/server_process.py CONFIG_JSON`` runs the
:class:`~orchestrator.server.Orchestrator` with that :class:`~orchestrator.config.ServerConfig` (as
``to_dict`` writes it: settings the command line does not offer, such as ``dp_min_cohort``, too),
its INFO log lines and its events (``EVENT {json}``) on stderr in the order they happen, so that a
test reading them can kill it (SIGKILL) at a named moment and start it again with ``resume``."""

from __future__ import annotations

import asyncio
import json
import logging
import sys

from orchestrator.config import ServerConfig
from orchestrator.server import Orchestrator


def main() -> None:
    config = ServerConfig(**json.loads(sys.argv[1]))
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(name)s %(message)s", force=True)

    def on_event(kind: str, data: dict) -> None:
        print(f"EVENT {json.dumps({'event': kind, **data}, default=str)}", file=sys.stderr, flush=True)

    asyncio.run(Orchestrator(config, on_event=on_event).run())


if __name__ == "__main__":
    main()
