"""Waiting on several anyio events at once."""

from __future__ import annotations

import anyio

__all__ = ("wait_any",)


async def wait_any(*events: anyio.Event) -> None:
    """Return as soon as one of ``events`` is set."""
    async with anyio.create_task_group() as race:

        async def until(event: anyio.Event) -> None:
            await event.wait()
            race.cancel_scope.cancel()

        for event in events:
            race.start_soon(until, event)
