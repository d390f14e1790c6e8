"""Stream resumption for ``ipybox mcp --transport http``: a bounded, in-memory event store.

With an event store the SDK's transport gives every SSE event an id and sends a ``retry:`` hint,
and a client that lost its connection (during a long ``execute_ipython_cell``, say) reconnects
with ``Last-Event-ID`` and gets what it missed, its result included. Events are kept in memory
only, the newest `MAX_EVENTS` across all streams: a client that stays away longer loses the
oldest, and gets nothing replayed rather than a partial stream.
"""

from __future__ import annotations

import secrets
from collections import OrderedDict

from mcp.server.streamable_http import EventCallback, EventMessage, EventStore
from mcp_types import JSONRPCMessage

__all__ = ("MAX_EVENTS", "RETRY_MS", "BoundedEventStore")

# Enough for the results of the cells of many sessions in flight; each event is one JSON-RPC message.
MAX_EVENTS = 10_000
# How long a client waits before reconnecting (the SSE ``retry:`` field).
RETRY_MS = 1000


class BoundedEventStore(EventStore):
    """The newest ``max_events`` events of every stream, for replay after a reconnect."""

    def __init__(self, max_events: int = MAX_EVENTS) -> None:
        self._max = max_events
        # event id -> (stream id, message); in the order stored, so the oldest is evicted first.
        self._events: OrderedDict[str, tuple[str, JSONRPCMessage | None]] = OrderedDict()

    async def store_event(self, stream_id: str, message: JSONRPCMessage | None) -> str:
        # Random, not a counter: the store serves every session, and an id must be received to be
        # known, so that no session can ask for the events (cell outputs) of another.
        event_id = secrets.token_urlsafe(16)
        self._events[event_id] = (stream_id, message)
        while len(self._events) > self._max:
            self._events.popitem(last=False)
        return event_id

    async def replay_events_after(self, last_event_id: str, send_callback: EventCallback) -> str | None:
        found = self._events.get(last_event_id)
        if found is None:
            return None  # unknown, or evicted: nothing trustworthy to replay
        stream = found[0]
        after = False
        for event_id, (stream_id, message) in list(self._events.items()):
            if after and stream_id == stream and message is not None:
                await send_callback(EventMessage(message, event_id))
            after = after or event_id == last_event_id
        return stream
