"""The hybrid store: local decisions on leases taken from a shared backend store."""

from stormguard.stores.hybrid.store import HybridDegraded, HybridStore, HybridSynced

__all__ = ["HybridDegraded", "HybridStore", "HybridSynced"]
