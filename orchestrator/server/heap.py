"""The server's heap between rounds: kept while rounds follow back to back, handed back when it waits.

A round's receive buffers are live at once (its devices upload together) and, trimmed at every
round's end, were faulted in anew each round: 9,000 page faults a round of ten mnist_cnn reports,
about 3.6 us each. Rounds of one run reuse buffers of the same sizes, so what is kept is about one
round's working set, and never more than :data:`ROUND_HEAP_SLACK` of growth. The server's own torch
work (the reference update, the chunks' check, validation, evaluation) runs inside :class:`RoundHeap`
(``with heap:``), which reuses freed buffers while it runs: with a mapping per buffer (the server's
setting, so its memory stays flat) every activation is faulted in anew, 3x a ResNet20 evaluation's time.
"""

from __future__ import annotations

from edge_sdk.memory import KeptHeap, release_memory, rss_bytes

__all__ = ["ROUND_HEAP_SLACK", "RoundHeap"]

#: How much a server keeping its heap between back-to-back rounds may grow past its size after the
#: last trim before the end of a round trims again (:meth:`RoundHeap.trim_after_round`).
ROUND_HEAP_SLACK = 64 << 20


class RoundHeap:
    """When the server keeps its freed buffers, and when it hands them back to the OS."""

    def __init__(self) -> None:
        self._kept = KeptHeap()
        self._held = False  # kept across back-to-back rounds (:meth:`keep`)
        self._trimmed_rss: int | None = None  # the resident size after the last trim (:meth:`trim_after_round`)

    @property
    def held(self) -> bool:
        """Whether freed buffers are being kept now."""
        return self._kept.held

    def __enter__(self) -> RoundHeap:
        self._kept.acquire()
        return self

    def __exit__(self, *exc: object) -> None:
        self._kept.release()

    def keep(self, keep: bool) -> None:
        """Keep the freed buffers of one round for the next while rounds follow back to back, or hand
        them back (when the server waits, and when it stops)."""
        if keep and not self._held:
            self._kept.acquire()
        elif not keep and self._held:
            self._kept.release()
        self._held = keep
        if not keep:
            self._trimmed_rss = None

    def trim_after_round(self) -> None:
        """The round's payloads and reports are gone: hand their heap back to the OS, unless the
        heap is kept for the next round and the process has grown less than
        :data:`ROUND_HEAP_SLACK` since the last trim (what a steady run keeps is one round's
        buffers; exports and checks of new chunks leave freed memory the next round may not fit
        in, and that is handed back)."""
        if self._held:
            rss = rss_bytes()
            if self._trimmed_rss is not None and rss <= self._trimmed_rss + ROUND_HEAP_SLACK:
                return
        release_memory()
        self._trimmed_rss = rss_bytes() if self._held else None
