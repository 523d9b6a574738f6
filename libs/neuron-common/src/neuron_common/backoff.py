"""Exponential back-off with full jitter, bounded, for every retry loop."""

from __future__ import annotations

import random


class Backoff:
    def __init__(self, initial: float = 0.1, maximum: float = 30.0, factor: float = 2.0) -> None:
        self.initial, self.maximum, self.factor = initial, maximum, factor
        self.attempts = 0

    def next_delay(self) -> float:
        ceiling = min(self.maximum, self.initial * self.factor**self.attempts)
        self.attempts += 1
        return random.uniform(ceiling / 2, ceiling)

    def reset(self) -> None:
        self.attempts = 0
