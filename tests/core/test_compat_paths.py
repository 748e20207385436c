"""The import paths that earlier releases documented still give the same objects."""

from __future__ import annotations

import importlib

import pytest

import stormguard

PATHS = [
    ("stormguard.ruleset", "stormguard.ratelimit.rules", ["RuleSet", "RulesError",
                                                          "RequestAttrs", "check_flow"]),
    ("stormguard.policies", "stormguard.resilience", ["LoggingListener", "add_listener",
                                                      "remove_listener", "Retry"]),
    ("stormguard.policies.events", "stormguard.observability.events", ["Event",
                                                                      "StateChanged"]),
    ("stormguard.errors", "stormguard._core.errors", ["StorageError", "ConfigError"]),
    ("stormguard.deadline", "stormguard._core.deadline", ["remaining", "scope", "current"]),
    ("stormguard.middleware", "stormguard.integrations.asgi", ["RateLimitMiddleware"]),
]


@pytest.mark.parametrize(("old", "new", "names"), PATHS, ids=[p[0] for p in PATHS])
def test_old_path_gives_the_same_objects(old: str, new: str, names: list[str]) -> None:
    old_mod, new_mod = importlib.import_module(old), importlib.import_module(new)
    for name in names:
        assert getattr(old_mod, name) is getattr(new_mod, name), name


def test_every_public_name_is_importable_from_the_package() -> None:
    for name in stormguard.__all__:
        assert getattr(stormguard, name) is not None, name
