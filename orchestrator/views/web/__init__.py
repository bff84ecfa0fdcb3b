"""``edgetrain serve --web``: the orchestrator's port also serves web pages (docs/web.md).

- :mod:`~orchestrator.views.web.site`: the HTTP side of the websocket port (device page, SDK, demo shards, status).
- :mod:`~orchestrator.views.web.files`: what may be served from disk, with the cross-origin isolation headers.
- :mod:`~orchestrator.views.web.status`: the read-only status snapshot and the events it keeps.
- :mod:`~orchestrator.views.terminal`: the page's URL and its QR code, for the person starting the server.
"""

from orchestrator.views.web.site import WebOptions, WebSite
from orchestrator.views.web.status import ServerView

__all__ = ["ServerView", "WebOptions", "WebSite"]
