"""`KeyedExecutions`: the executor's record of executions started with a key."""

from __future__ import annotations

from collections import OrderedDict

from ipybox._exceptions import ExecutionLost, UsageError

from ._execution import Execution

__all__ = ("KeyedExecutions",)

# How many keys of released executions are remembered, so that starting one of them again is refused
# (the code must never run twice for one key) while memory stays bounded over any number of keys.
RELEASED_KEYS = 4096
DELIVERED = "ended and its outcome was already delivered"


class KeyedExecutions:
    """Keyed executions while they matter, and the keys of those already forgotten.

    A keyed execution is held until its outcome was delivered or its ttl ran out; then only its key
    is kept (the latest `RELEASED_KEYS` of them), so that the same key is never run twice.
    """

    def __init__(self) -> None:
        self._by_key: dict[str, Execution] = {}
        # Keys of executions that ended and were forgotten, oldest first: key -> why.
        self._released: OrderedDict[str, str] = OrderedDict()

    def __len__(self) -> int:
        return len(self._by_key)

    def existing(self, key: str, code: str) -> Execution | None:
        """The execution already started with ``key``, or None if the key is new.

        Raises:
            UsageError: ``key`` was used for different code.
            ExecutionLost: ``key`` belongs to an execution that was already forgotten.
        """
        existing = self._by_key.get(key)
        if existing is not None:
            if existing.code != code:
                raise UsageError(f"execution key {key!r} was already used for different code")
            return existing
        if key in self._released:
            raise ExecutionLost(f"the execution with key {key!r} {self._released[key]}; it is not run again")
        return None

    def add(self, execution: Execution) -> None:
        assert execution.key is not None
        self._by_key[execution.key] = execution

    def attach(self, key: str) -> Execution:
        """The execution started with ``key``.

        Raises:
            ExecutionLost: No execution with this key is held (any more).
        """
        try:
            return self._by_key[key]
        except KeyError:
            why = self._released.get(key)
            if why is not None:
                raise ExecutionLost(f"the execution with key {key!r} {why}; it is not run again") from None
            raise ExecutionLost(
                f"no execution with key {key!r} in this executor (it was never started here, or the "
                "executor was restarted); it is not run again automatically"
            ) from None

    def release(self, execution: Execution, why: str = DELIVERED) -> None:
        """Forget a keyed execution, remembering only its key and ``why``."""
        key = execution.key
        if key is None or self._by_key.get(key) is not execution:
            return
        del self._by_key[key]
        self._released[key] = why
        while len(self._released) > RELEASED_KEYS:
            self._released.popitem(last=False)
