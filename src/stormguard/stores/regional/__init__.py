"""Multi-region quotas: :class:`RegionalStore` (see docs/regions.md)."""

from stormguard.stores.regional.board import Board, MemoryBoard, RedisBoard
from stormguard.stores.regional.events import PeerLost, PeerRecovered, ShareChanged, SyncFailed
from stormguard.stores.regional.shares import plan_shares, waterfill
from stormguard.stores.regional.store import RegionalStore

__all__ = ["Board", "MemoryBoard", "PeerLost", "PeerRecovered", "RedisBoard", "RegionalStore",
           "ShareChanged", "SyncFailed", "plan_shares", "waterfill"]
