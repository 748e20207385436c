"""Scenario files: YAML checked against a JSON Schema, then normalized to seconds.

:func:`load` reads a YAML (or JSON) file or text, :func:`from_dict` takes the parsed
mapping. Structure is checked by ``scenario.schema.json`` (shipped in this package,
:data:`SCHEMA`; ``stormguard simulate --schema`` prints it) and meaning by Python:
every error is a :class:`stormguard.ConfigError` whose field is the path in the file
(``services.checkout.endpoints.order.steps[2].policies[0].retry.attempts``).
:meth:`Scenario.to_dict` gives the normalized mapping (durations in seconds, defaults
filled in); ``from_dict(s.to_dict()) == s`` and :func:`dump` writes it back as YAML.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Any

from stormguard._core import validate
from stormguard._core.errors import ConfigError

__all__ = ["Scenario", "dump", "from_dict", "load", "schema"]


@cache
def schema() -> dict[str, Any]:
    """The JSON Schema of a scenario file."""
    text = resources.files("stormguard.sim").joinpath("scenario.schema.json").read_text("utf-8")
    data: dict[str, Any] = json.loads(text)
    return data


@dataclass(frozen=True)
class Scenario:
    """A validated scenario, durations in seconds (see :func:`from_dict`)."""

    name: str
    duration: float
    seed: int
    measure: tuple[float, float]
    dependencies: dict[str, dict[str, Any]]
    services: dict[str, dict[str, Any]]
    traffic: list[dict[str, Any]]
    description: str = ""
    queues: dict[str, dict[str, Any]] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name}
        if self.description:
            out["description"] = self.description
        out.update({
            "duration": self.duration, "seed": self.seed,
            "measure": {"start": self.measure[0], "end": self.measure[1]},
            "dependencies": self.dependencies, "services": self.services,
            "traffic": self.traffic})
        if self.queues:
            out["queues"] = self.queues
        return json.loads(json.dumps(out))  # type: ignore[no-any-return]


def _path(parts: Any) -> str:
    out = ""
    for p in parts:
        out += f"[{p}]" if isinstance(p, int) else (f".{p}" if out else str(p))
    return out or "scenario"


def _check_schema(data: object) -> None:
    import jsonschema

    validator = jsonschema.Draft202012Validator(schema())
    errors = sorted(validator.iter_errors(data), key=lambda e: (len(e.absolute_path),
                                                                list(map(str, e.absolute_path))))
    if errors:
        # the deepest error of a oneOf says what is wrong where; report the first one
        err = errors[0]
        best = jsonschema.exceptions.best_match([err])
        raise ConfigError(_path(best.absolute_path), best.instance, best.message)


def _latency(field: str, spec: Any) -> dict[str, Any]:
    if not isinstance(spec, dict):
        return {"dist": "constant", "value": validate.duration(field, spec, allow_zero=True)}
    out: dict[str, Any] = {"dist": spec["dist"]}
    for key, value in spec.items():
        if key != "dist":
            out[key] = validate.duration(f"{field}.{key}", value, allow_zero=key == "low")
    if out["dist"] == "uniform" and out["high"] < out["low"]:
        raise ConfigError(f"{field}.high", spec["high"], "must be >= low")
    if out["dist"] == "lognormal" and out["p99"] <= out["median"]:
        raise ConfigError(f"{field}.p99", spec["p99"], "must be > median")
    return out


def _rate(field: str, spec: Any) -> Any:
    if not isinstance(spec, list):
        return float(spec)
    out = []
    last = 0.0
    for i, entry in enumerate(spec):
        f = f"{field}[{i}]"
        e: dict[str, Any] = {"at": validate.duration(f"{f}.at", entry["at"], allow_zero=True),
                             "rate": float(entry["rate"])}  # a float: e is dict[str, Any]
        if e["at"] < last:
            raise ConfigError(f"{f}.at", entry["at"], "must not be before the previous entry")
        last = e["at"]
        for key in ("ramp", "for"):
            if key in entry:
                e[key] = validate.duration(f"{f}.{key}", entry[key])
        out.append(e)
    return out


def from_dict(data: object) -> Scenario:  # noqa: PLR0915 -- one pass over the sections, in order
    """Validate a parsed scenario mapping (see the module docstring)."""
    _check_schema(data)
    assert isinstance(data, dict)
    name = validate.text("name", data["name"])
    duration = validate.duration("duration", data["duration"])
    seed = int(data.get("seed", 1))
    m = data.get("measure", {})
    start = validate.duration("measure.start", m.get("start", 0.0), allow_zero=True)
    end = validate.duration("measure.end", m.get("end", duration))
    if end > duration:
        raise ConfigError("measure.end", m.get("end"), f"must be <= duration ({duration:g})")
    if start >= end:
        raise ConfigError("measure.start", m.get("start"), f"must be before measure.end ({end:g})")

    deps: dict[str, dict[str, Any]] = {}
    for dname, spec in data.get("dependencies", {}).items():
        f = f"dependencies.{dname}"
        d: dict[str, Any] = {"latency": _latency(f"{f}.latency", spec["latency"]),
                             "error_rate": float(spec.get("error_rate", 0.0)),
                             "capacity": spec.get("capacity")}
        changes = []
        last = 0.0
        for i, ch in enumerate(spec.get("changes", [])):
            cf = f"{f}.changes[{i}]"
            c: dict[str, Any] = {"at": validate.duration(f"{cf}.at", ch["at"], allow_zero=True)}
            if c["at"] < last:
                raise ConfigError(f"{cf}.at", ch["at"], "must not be before the previous change")
            last = c["at"]
            if "latency" in ch:
                c["latency"] = _latency(f"{cf}.latency", ch["latency"])
            for key in ("error_rate", "capacity"):
                if key in ch:
                    c[key] = ch[key]
            changes.append(c)
        if changes:
            d["changes"] = changes
        deps[dname] = d

    services: dict[str, dict[str, Any]] = {}
    for sname, spec in data["services"].items():
        f = f"services.{sname}"
        if "." in sname:
            raise ConfigError(f, sname, "a service name cannot contain '.'")
        endpoints: dict[str, Any] = {}
        for ename, espec in spec["endpoints"].items():
            steps: list[dict[str, Any]] = []
            for k, step in enumerate(espec["steps"]):
                sf = f"{f}.endpoints.{ename}.steps[{k}]"
                if "work" in step:
                    steps.append({"work": validate.duration(f"{sf}.work", step["work"],
                                                            allow_zero=True)})
                    continue
                if step["call"] not in deps:
                    raise ConfigError(f"{sf}.call", step["call"],
                                      f"no such dependency (known: {', '.join(deps) or 'none'})")
                steps.append({"call": step["call"], "policies": list(step.get("policies", []))})
            endpoints[ename] = {"steps": steps}
            if "route" in espec:
                endpoints[ename]["route"] = _route(f"{f}.endpoints.{ename}.route",
                                                   espec["route"])
        services[sname] = {"instances": int(spec.get("instances", 1)),
                           "threads": spec.get("threads", 200),
                           "queue_limit": spec.get("queue_limit"),
                           "endpoints": endpoints}
        if "rate_limit" in spec:
            services[sname]["rate_limit"] = _rate_limit(f"{f}.rate_limit", spec["rate_limit"])
        if "load_shedding" in spec:
            services[sname]["load_shedding"] = _shedding(f"{f}.load_shedding",
                                                         spec["load_shedding"])

    traffic = []
    seen: set[str] = set()
    for i, t in enumerate(data["traffic"]):
        f = f"traffic[{i}]"
        if t["name"] in seen:
            raise ConfigError(f"{f}.name", t["name"], "is used twice")
        seen.add(t["name"])
        sname, _, ename = t["target"].partition(".")
        if sname not in services or ename not in services[sname]["endpoints"]:
            known = [f"{s}.{e}" for s, sv in services.items() for e in sv["endpoints"]]
            raise ConfigError(f"{f}.target", t["target"],
                              f"must be service.endpoint, one of {', '.join(known)}")
        clients = []
        for j, c in enumerate(t.get("clients", [])):
            cf = f"{f}.clients[{j}]"
            layer: dict[str, Any] = {"name": c["name"]}
            if "timeout" in c:
                layer["timeout"] = validate.duration(f"{cf}.timeout", c["timeout"])
            if "retry" in c:
                r = c["retry"]
                layer["retry"] = {
                    "attempts": int(r.get("attempts", 3)),
                    "base": validate.duration(f"{cf}.retry.base", r.get("base", 0.1),
                                              allow_zero=True),
                    "multiplier": float(r.get("multiplier", 2.0)),
                    "max_delay": validate.duration(f"{cf}.retry.max_delay",
                                                   r.get("max_delay", 5.0), allow_zero=True),
                    "jitter": r.get("jitter", "full")}
                if layer["retry"]["base"] > layer["retry"]["max_delay"]:
                    raise ConfigError(f"{cf}.retry.base", r.get("base"), "must be <= max_delay")
                if r.get("retry_after"):
                    layer["retry"]["retry_after"] = True
                if "max_retry_after" in r:
                    layer["retry"]["max_retry_after"] = validate.duration(
                        f"{cf}.retry.max_retry_after", r["max_retry_after"], allow_zero=True)
            clients.append(layer)
        entry = {"name": t["name"], "target": t["target"],
                 "arrival": {"process": t["arrival"].get("process", "poisson"),
                             "rate": _rate(f"{f}.arrival.rate", t["arrival"]["rate"])},
                 "clients": clients}
        if "keys" in t:
            entry["keys"] = _keys(f"{f}.keys", t["keys"])
        if "priority" in t:
            if "load_shedding" not in services[sname]:
                raise ConfigError(f"{f}.priority", t["priority"],
                                  f"applies only to a service with load_shedding ({sname} "
                                  "has none)")
            entry["priority"] = t["priority"]
        traffic.append(entry)
    queues: dict[str, dict[str, Any]] = {}
    for qname, q in data.get("queues", {}).items():
        queues[qname] = _queue(f"queues.{qname}", q, deps)
    scenario = Scenario(name=name, duration=duration, seed=seed, measure=(start, end),
                        dependencies=deps, services=services, traffic=traffic,
                        description=str(data.get("description", "")), queues=queues)
    _check_policies(scenario)
    return scenario


def _route(where: str, value: Any) -> str:
    """An endpoint's route, ``"METHOD /path"`` (what rate-limit rules and load-shedding
    priorities match)."""
    from stormguard.ratelimit.rules import METHODS

    text = validate.text(where, value)
    method, _, path = text.strip().partition(" ")
    if method.upper() not in METHODS or not path.strip().startswith("/"):
        raise ConfigError(where, value, "must be 'METHOD /path', such as 'POST /checkout'")
    return f"{method.upper()} {path.strip()}"


def _rate_limit(where: str, spec: dict[str, Any]) -> dict[str, Any]:
    from stormguard.sim.inbound import build_rules

    rules = build_rules(f"{where}.rules", spec["rules"])
    out = {"rules": rules.to_data()["rules"], "store": spec.get("store", "shared")}
    if out["store"] == "hybrid":
        out["sync_interval"] = validate.duration(f"{where}.sync_interval",
                                                 spec.get("sync_interval", 0.1))
        out["hot_rate"] = validate.number(f"{where}.hot_rate", spec.get("hot_rate", 0.0),
                                          allow_zero=True)
    else:
        for key in ("sync_interval", "hot_rate"):
            if key in spec:
                raise ConfigError(f"{where}.{key}", spec[key], "applies only to store: hybrid")
    return out


def _shedding(where: str, spec: dict[str, Any]) -> dict[str, Any]:
    from stormguard.sim.inbound import build_priorities, build_shedder
    from stormguard.sim.runtime import SimClock

    out: dict[str, Any] = {}
    limit = spec.get("limit")
    if isinstance(limit, dict):
        a = dict(limit["adaptive"])
        if "window" in a:
            a["window"] = validate.duration(f"{where}.limit.adaptive.window", a["window"])
        out["limit"] = {"adaptive": a}
    else:
        out["limit"] = limit
    for key, default in (("queue_timeout", 0.05), ("codel_target", 0.005),
                         ("codel_interval", 0.1), ("retry_after", 1.0)):
        out[key] = validate.duration(f"{where}.{key}", spec.get(key, default),
                                     allow_zero=key in ("queue_timeout", "retry_after"))
    out["max_queue"] = spec.get("max_queue", 1000)
    if spec.get("shares") is not None:
        out["shares"] = dict(spec["shares"])
    out["priorities"] = dict(spec.get("priorities", {}))
    out["default"] = spec.get("default", "degraded")
    build_priorities(where, out)
    build_shedder(where, out, SimClock(), "check")
    return out


def _keys(where: str, spec: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"count": spec.get("count", 1)}
    templates: dict[str, str] = {k: validate.text(f"{where}.{k}", spec[k])
                                 for k in ("user", "api_key", "ip")
                 if k in spec}
    if not templates:
        raise ConfigError(where, spec, "names no client: give user, api_key or ip (a name, "
                          "or a template with {i}, the client's rank)")
    if out["count"] > 1:
        for k, t in templates.items():
            if "{i}" not in t:
                raise ConfigError(f"{where}.{k}", t, f"must contain {{i}} to tell the "
                                  f"{out['count']} clients apart")
        out["popularity"] = spec.get("popularity", "uniform")
        if out["popularity"] == "zipf":
            out["exponent"] = validate.number(f"{where}.exponent", spec.get("exponent", 1.0))
    out.update(templates)
    if "tier" in spec:
        out["tier"] = validate.text(f"{where}.tier", spec["tier"])
    return out


def _queue(where: str, spec: dict[str, Any], deps: dict[str, Any]) -> dict[str, Any]:
    if spec["call"] not in deps:
        raise ConfigError(f"{where}.call", spec["call"],
                          f"no such dependency (known: {', '.join(deps) or 'none'})")
    b = spec.get("backoff", {})
    out: dict[str, Any] = {
        "call": spec["call"], "policies": list(spec.get("policies", [])),
        "rate": spec.get("rate"), "concurrency": spec.get("concurrency", 8),
        "max_attempts": spec.get("max_attempts", 10),
        "backoff": {"base": validate.duration(f"{where}.backoff.base", b.get("base", 1.0),
                                              allow_zero=True),
                    "multiplier": float(b.get("multiplier", 2.0)),
                    "max_delay": validate.duration(f"{where}.backoff.max_delay",
                                                   b.get("max_delay", 60.0), allow_zero=True),
                    "jitter": float(b.get("jitter", 0.5))},
        "visibility_timeout": validate.duration(f"{where}.visibility_timeout",
                                                spec.get("visibility_timeout", 30.0)),
        "poll_interval": validate.duration(f"{where}.poll_interval",
                                           spec.get("poll_interval", 0.1)),
        "start": validate.duration(f"{where}.start", spec.get("start", 0.0), allow_zero=True)}
    if out["backoff"]["max_delay"] < out["backoff"]["base"]:
        raise ConfigError(f"{where}.backoff.max_delay", b.get("max_delay"), "must be >= base")
    return out


def _check_policies(scenario: Scenario) -> None:
    """Build every step's policies once so that their options are checked now."""
    import random

    from stormguard.sim.policies import BuildContext, build_policies
    from stormguard.sim.runtime import SimClock

    clock = SimClock()
    queues: dict[str, Any] = {}
    if scenario.queues:
        from stormguard.sim.inbound import memory_queue

        queues = {q: memory_queue(q, clock) for q in scenario.queues}
    ctx = BuildContext(clock=clock, rng=random.Random(0), listener=lambda _e: None,
                       instance=0, queues=queues)
    for qname, q in scenario.queues.items():
        where = f"queues.{qname}.policies"
        policies = build_policies(q["policies"], ctx, where, q["call"])
        if any(type(p).__name__ == "DeferFallback" for p in policies):
            raise ConfigError(where, q["policies"], "a worker's pipeline cannot defer: a job "
                              "that fails would be deferred again instead of retried")
    for sname, svc in scenario.services.items():
        for ename, ep in svc["endpoints"].items():
            for k, step in enumerate(ep["steps"]):
                if "call" in step:
                    build_policies(step["policies"], ctx,
                                   f"services.{sname}.endpoints.{ename}.steps[{k}].policies",
                                   step["call"])


def load(source: str | Path) -> Scenario:
    """A scenario from a YAML/JSON file path, or from YAML text (with a newline)."""
    import yaml

    if isinstance(source, Path) or "\n" not in source:
        path = Path(source)
        try:
            text = path.read_text("utf-8")
        except OSError as exc:
            raise ConfigError("scenario", str(source), f"cannot be read: {exc.strerror}") from None
    else:
        text = source
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError("scenario", str(source)[:80], f"is not valid YAML: {exc}") from None
    return from_dict(data)


def dump(scenario: Scenario) -> str:
    """The normalized scenario as YAML (``load(dump(s)) == s``)."""
    import yaml

    return str(yaml.safe_dump(scenario.to_dict(), sort_keys=False))
