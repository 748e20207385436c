"""Reload the Envoy configuration when its files change, as envoyproxy/ratelimit reloads
its runtime directory: the new configuration applies to the next request; an invalid one
is refused whole (logged and counted) and the previous one stays in force. Counters are
kept across a reload for every limit whose parameters did not change."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
from collections.abc import Iterable
from pathlib import Path

from stormguard._core.errors import ConfigError

from .envoy import load_envoy_config
from .rls import EnvoyChecker

__all__ = ["EnvoyConfigWatcher"]

log = logging.getLogger("stormguard.service")
Signature = tuple[tuple[str, int, int], ...]


class EnvoyConfigWatcher:
    """Polls the configuration's files every ``poll_interval`` seconds (a service
    companion: started and stopped with the app)."""

    def __init__(self, paths: str | os.PathLike[str] | Iterable[str | os.PathLike[str]],
                 checker: EnvoyChecker, *, poll_interval: float = 1.0) -> None:
        self.paths = [Path(paths)] if isinstance(paths, str | os.PathLike) else \
            [Path(p) for p in paths]
        self.checker = checker
        self.poll_interval = poll_interval
        self.signature = self._signature()
        self._task: asyncio.Task[None] | None = None

    def _signature(self) -> Signature:
        """Name, modification time and size of every file (symlinks followed: a
        Kubernetes ConfigMap update swaps a symlink)."""
        out: list[tuple[str, int, int]] = []
        for p in self.paths:
            files = sorted(p.iterdir()) if p.is_dir() else [p]
            for f in files:
                try:
                    st = f.stat()
                except OSError:
                    continue
                if f.suffix in (".yaml", ".yml") or not p.is_dir():
                    out.append((str(f), st.st_mtime_ns, st.st_size))
        return tuple(out)

    async def refresh(self) -> bool:
        """Reload if a file changed; True when a new configuration was applied."""
        sig = await asyncio.to_thread(self._signature)
        if sig == self.signature:
            return False
        self.signature = sig
        metrics = self.checker.metrics
        try:
            config = await asyncio.to_thread(load_envoy_config, self.paths)
        except ConfigError as exc:
            metrics.reloads["error"] = metrics.reloads.get("error", 0) + 1
            log.error("stormguard: Envoy configuration refused, the previous one stays: %s",
                      exc)
            return False
        self.checker.config = config
        metrics.reloads["ok"] = metrics.reloads.get("ok", 0) + 1
        log.info("stormguard: Envoy configuration reloaded: domains %s (%d limits)",
                 ", ".join(sorted(config.domains)), len(config.limits()))
        return True

    async def _run(self) -> None:
        while True:
            await asyncio.sleep(self.poll_interval)
            try:
                await self.refresh()
            except Exception:  # never let the watcher die: the next poll tries again
                log.exception("stormguard: reloading the Envoy configuration failed")

    async def start(self) -> None:
        if self._task is None:
            self._task = asyncio.get_running_loop().create_task(self._run())

    async def stop(self) -> None:
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
