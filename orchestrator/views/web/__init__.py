"""``edgetrain serve --web``: the orchestrator's port also serves web pages (docs/web.md).

- :mod:`~orchestrator.web.site`: the HTTP side of the websocket port (device page, SDK, demo shards, status).
- :mod:`~orchestrator.web.files`: what may be served from disk, with the cross-origin isolation headers.
- :mod:`~orchestrator.web.status`: the read-only status snapshot and the events it keeps.
- :mod:`~orchestrator.web.terminal`: the page's URL and its QR code, for the person starting the server.
"""

from orchestrator.web.site import WebSite

__all__ = ["WebSite"]
