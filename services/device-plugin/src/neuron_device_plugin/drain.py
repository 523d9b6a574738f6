"""How long the plugin keeps answering the kubelet after it was told to stop.

The kubelet closes its connection to a plugin the moment the plugin's ListAndWatch stream ends,
and an Allocate still on the wire fails with it: the pod being admitted fails for good
(UnexpectedAdmissionError), though its devices were free and the plugin answered. A pod
kube-scheduler bound a moment before the plugin's SIGTERM (a rolling update, a restart) is
admitted in the next second or so. So the streams end, and the servers stop, only once `hold`
seconds have passed since the stop and no call came for `quiet` seconds, and at most `limit`
seconds after the stop, so a kubelet admitting pods without pause cannot keep the process alive.
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Awaitable, Callable


class Drain:
    def __init__(
        self,
        hold: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
    ) -> None:
        self.hold = hold
        self.quiet = min(hold, 0.5)
        self.limit = 4 * hold
        self._clock = clock
        self._sleep = sleep
        self._last_call = -math.inf
        self._stopped_at: float | None = None

    def call(self) -> None:
        """The kubelet called the plugin (GetPreferredAllocation, Allocate, PreStartContainer)."""
        self._last_call = self._clock()

    def until(self) -> float:
        """When the drain ends, on the drain's clock, as far as the calls so far tell."""
        if self._stopped_at is None:
            self._stopped_at = self._clock()  # the first to ask is told of the stop at once
        end = max(self._stopped_at + self.hold, self._last_call + self.quiet)
        return min(end, self._stopped_at + self.limit)

    async def settled(self) -> None:
        """Return once the drain is over: call after the stop."""
        while (left := self.until() - self._clock()) > 0:
            await self._sleep(left)
