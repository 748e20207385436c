"""Discrete-event simulation in virtual time, running the real stormguard policies.

:class:`Engine` is the one event queue every simulation of the project runs on.
"""

from __future__ import annotations

from stormguard.sim.engine import Engine, Handle

__all__ = ["Engine", "Handle"]
