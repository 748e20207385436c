"""The rate-limit service: ``create_app(...)`` builds the Starlette app that
``stormguard serve`` runs (needs the ``service`` extra)."""

from __future__ import annotations

from stormguard.service.app import create_app

__all__ = ["create_app"]
