"""Scenario files: the JSON Schema, errors naming the field, the round trip."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from stormguard import ConfigError
from stormguard.sim import salenight
from stormguard.sim.scenario import dump, from_dict, load, schema

EXAMPLE = """\
name: example
description: two services' worth of knobs
duration: 1 min
seed: 3
measure: {start: 10s, end: 50s}
dependencies:
  sms:
    latency: {dist: lognormal, median: 150ms, p99: 600ms}
    error_rate: 0.01
    capacity: 2000
    changes:
      - {at: 20s, latency: 30s}
      - {at: 40s, latency: {dist: exponential, mean: 200ms}, capacity: null}
  db:
    latency: {dist: uniform, low: 1ms, high: 9ms}
services:
  checkout:
    instances: 2
    threads: 50
    queue_limit: 100
    endpoints:
      order:
        steps:
          - work: 20ms
          - call: db
          - call: sms
            policies:
              - fallback: {value: queued}
              - circuit_breaker: {window: 20, failure_rate: 0.5, open_for: 30s}
              - retry: {attempts: 2, base: 50ms, budget: {ratio: 0.1}}
              - bulkhead: {max_concurrent: 10}
              - timeout: 1s
traffic:
  - name: orders
    target: checkout.order
    arrival:
      process: constant
      rate: [{at: 0, rate: 10}, {at: 5s, rate: 100, ramp: 5s}, {at: 30s, rate: 500, for: 2s}]
    clients:
      - {name: app, timeout: 3s, retry: {attempts: 3, base: 100ms, jitter: equal}}
"""


def test_the_schema_is_a_valid_json_schema() -> None:
    jsonschema.Draft202012Validator.check_schema(schema())


def test_example_loads_and_round_trips(tmp_path: Path) -> None:
    s = load(EXAMPLE)
    assert s.duration == 60.0
    assert s.measure == (10.0, 50.0)
    sms = s.dependencies["sms"]
    assert sms["latency"] == {"dist": "lognormal", "median": 0.15, "p99": 0.6}
    assert sms["changes"][0] == {"at": 20.0, "latency": {"dist": "constant", "value": 30.0}}
    assert s.traffic[0]["arrival"]["rate"][1] == {"at": 5.0, "rate": 100.0, "ramp": 5.0}
    assert s.traffic[0]["clients"][0]["retry"]["jitter"] == "equal"
    # normalized mapping -> same scenario; YAML text -> same scenario; a file -> same
    assert from_dict(s.to_dict()) == s
    assert load(dump(s)) == s
    path = tmp_path / "scenario.yaml"
    path.write_text(dump(s), encoding="utf-8")
    assert load(path) == s
    assert load(str(path)) == s
    # and the normalized form validates against the published schema itself
    jsonschema.validate(s.to_dict(), schema())


@pytest.mark.parametrize("name", sorted(salenight.scenarios()))
def test_every_built_in_scenario_round_trips(name: str) -> None:
    s = salenight.scenario(name)
    assert load(dump(s)) == s


def _bad(path: str, value: Any) -> dict[str, Any]:
    data = yaml.safe_load(EXAMPLE)
    node = data
    keys = path.split("/")
    for k in keys[:-1]:
        node = node[int(k)] if isinstance(node, list) else node[k]
    last = keys[-1]
    if value is _DELETE:
        del node[last]
    elif isinstance(node, list):
        node[int(last)] = value
    else:
        node[last] = value
    return data


_DELETE = object()


@pytest.mark.parametrize(("path", "value", "field", "problem"), [
    ("duration", "soon", "duration", "duration such as"),
    ("duration", _DELETE, "scenario", "'duration' is a required property"),
    ("seed", "x", "seed", "integer"),
    ("bogus", 1, "scenario", "Additional properties"),
    ("measure/end", 120, "measure.end", "<= duration"),
    ("measure/start", 55, "measure.start", "before measure.end"),
    ("dependencies/sms/error_rate", 1.5, "dependencies.sms.error_rate",
     "greater than the maximum of 1"),
    ("dependencies/sms/capacity", 0, "dependencies.sms.capacity", "less than or equal to"),
    ("dependencies/sms/latency", {"dist": "lognormal", "median": 1, "p99": 0.5},
     "dependencies.sms.latency.p99", "> median"),
    ("dependencies/sms/latency", {"dist": "weird"}, "dependencies.sms.latency",
     "not valid under any"),
    ("dependencies/sms/changes/1/at", 5, "dependencies.sms.changes[1].at", "before the previous"),
    ("services/checkout/threads", 0, "services.checkout.threads", "minimum"),
    ("services/checkout/endpoints/order/steps/1/call", "nope",
     "services.checkout.endpoints.order.steps[1].call", "no such dependency"),
    ("services/checkout/endpoints/order/steps/2/policies/3",
     {"bulkhead": {"max_concurrent": 0}},
     "services.checkout.endpoints.order.steps[2].policies[3].bulkhead.max_concurrent", ">= 1"),
    ("services/checkout/endpoints/order/steps/2/policies/3",
     {"bulkhead": {"max_wait": "1s"}},
     "services.checkout.endpoints.order.steps[2].policies[3].bulkhead.max_wait", "must be 0"),
    ("services/checkout/endpoints/order/steps/2/policies/2",
     {"retry": {"attempts": 0}},
     "services.checkout.endpoints.order.steps[2].policies[2].retry.attempts", ">= 1"),
    ("services/checkout/endpoints/order/steps/2/policies/2",
     {"retry": {"tries": 3}},
     "services.checkout.endpoints.order.steps[2].policies[2].retry.tries", "unknown option"),
    ("services/checkout/endpoints/order/steps/2/policies/1",
     {"circuit_breaker": {"failure_rate": 2}},
     "services.checkout.endpoints.order.steps[2].policies[1].circuit_breaker.failure_rate",
     "must be <= 1"),
    ("services/checkout/endpoints/order/steps/2/policies/0", {"teleport": {}},
     "services.checkout.endpoints.order.steps[2].policies[0]", "unknown policy"),
    ("services/checkout/endpoints/order/steps/2/policies/4", {"timeout": "-1s"},
     "services.checkout.endpoints.order.steps[2].policies[4].timeout", "duration such as"),
    ("traffic/0/target", "checkout.nope", "traffic[0].target", "service.endpoint"),
    ("traffic/0/arrival/process", "bursty", "traffic[0].arrival.process", "is not one of"),
    ("traffic/0/arrival/rate", -1, "traffic[0].arrival.rate", "less than the minimum"),
    ("traffic/0/arrival/rate/2/at", "1s", "traffic[0].arrival.rate[2].at",
     "before the previous"),
    ("traffic/0/clients/0/retry/jitter", "lots", "traffic[0].clients[0].retry.jitter",
     "is not one of"),
    ("traffic/0/clients/0/retry/base", "10s", "traffic[0].clients[0].retry.base",
     "<= max_delay"),
])
def test_errors_name_the_field(path: str, value: Any, field: str, problem: str) -> None:
    data = _bad(path, copy.deepcopy(value) if value is not _DELETE else value)
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    assert info.value.field == field, str(info.value)
    assert problem in str(info.value)


def test_unreadable_and_invalid_files_are_config_errors(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot be read"):
        load(tmp_path / "missing.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: [unclosed\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load(bad)
    with pytest.raises(ConfigError, match="scenario"):
        load("- just\n- a list\n")


def test_duplicate_traffic_names_are_refused() -> None:
    data = yaml.safe_load(EXAMPLE)
    data["traffic"].append(copy.deepcopy(data["traffic"][0]))
    with pytest.raises(ConfigError) as info:
        from_dict(data)
    assert info.value.field == "traffic[1].name"
