"""The events of :class:`~stormguard.RegionalStore` (built only when someone listens, on the
sync path: never on a check). ``policy`` is ``"regional:<region>"``."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import ClassVar

from stormguard.observability.events import Event

__all__ = ["PeerLost", "PeerRecovered", "ShareChanged", "SyncFailed"]


@dataclass(frozen=True, slots=True)
class ShareChanged(Event):
    """The share this region enforces for ``key`` under the rule ``rule_id`` moved from
    ``old`` to ``new`` (fractions of the global limit); ``limit`` is the new local limit."""

    log_level: ClassVar[int] = logging.INFO

    key: str
    rule_id: str
    old: float
    new: float
    limit: int


@dataclass(frozen=True, slots=True)
class PeerLost(Event):
    """No fresh report from ``peer`` for longer than the lease (``silent`` seconds)."""

    log_level: ClassVar[int] = logging.WARNING

    peer: str
    silent: float


@dataclass(frozen=True, slots=True)
class PeerRecovered(Event):
    """``peer``'s reports are fresh again after it was lost."""

    log_level: ClassVar[int] = logging.INFO

    peer: str


@dataclass(frozen=True, slots=True)
class SyncFailed(Event):
    """A sync step failed: ``operation`` is "publish" (to ``peer``'s store), "read" (this
    region's own board), "decode" (a report from ``peer`` that does not parse) or
    "restore" (this region's own last report, read at construction)."""

    log_level: ClassVar[int] = logging.WARNING

    peer: str
    operation: str
    error: BaseException
