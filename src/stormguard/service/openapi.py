"""The OpenAPI 3.1 document of the service (written by hand: it is the contract)."""

from __future__ import annotations

import functools
from typing import Any

from stormguard.ratelimit.rules import SCOPES

__all__ = ["openapi_document"]

_STR_OR_NULL = {"type": ["string", "null"]}


def _ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


def _json_body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


def _answer(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {"description": description}
    if schema is not None:
        out["content"] = {"application/json": {"schema": schema}}
    return out


_ERRORS = {
    "400": _answer("Malformed JSON", _ref("Error")),
    "413": _answer("Body larger than 64 KiB", _ref("Error")),
    "422": _answer("Invalid field (the message names it)", _ref("Error")),
}
_RULES_ERRORS = {**_ERRORS, "413": _answer("Body larger than 4 MiB", _ref("Error"))}
_ADMIN_ERRORS = {
    "401": _answer("Missing or wrong bearer token", _ref("Error")),
    "403": _answer("Control plane disabled (no STORMGUARD_ADMIN_TOKEN)", _ref("Error")),
    "412": _answer("If-Match does not name the current version", _ref("Error")),
    "503": _answer("Rules storage unavailable", _ref("Error")),
}
_IF_MATCH = {"name": "If-Match", "in": "header", "required": False,
             "description": 'The ETag ("<version>") the edit is based on',
             "schema": {"type": "string"}}
_NAME = {"name": "name", "in": "path", "required": True, "schema": {"type": "string"}}
_INT_HEADER = {"schema": {"type": "string", "pattern": "^[0-9]+$"}}
_RATE_LIMIT_HEADERS = {
    "X-RateLimit-Limit": {**_INT_HEADER, "description": "the binding rule's limit"},
    "X-RateLimit-Remaining": {**_INT_HEADER, "description": "requests left in it"},
    "X-RateLimit-Reset": {**_INT_HEADER,
                          "description": "seconds until it is full again (rounded up)"},
    "RateLimit": {"schema": {"type": "string"}, "examples": ['"search";r=4;t=60'],
                  "description": "IETF draft-ietf-httpapi-ratelimit-headers: remaining "
                                 "(r) and seconds to reset (t) of the named policy"},
    "RateLimit-Policy": {"schema": {"type": "string"}, "examples": ['"search";q=5;w=60'],
                         "description": "the policy: quota (q) per window (w) seconds"},
    "Retry-After": {**_INT_HEADER,
                    "description": "seconds to wait; only when the check is denied"},
}
"""The headers a check's answer carries (of the binding rule; none when no rule matched)."""


@functools.cache
def _document() -> dict[str, Any]:
    limit = {
        "limit": {"type": "integer", "minimum": 1},
        "window": {"type": ["number", "string"], "examples": [60, "1m"]},
        "algorithm": {"enum": ["fixed_window", "sliding_window_log",
                               "sliding_window_counter", "token_bucket", "gcra",
                               "leaky_bucket", None]},
        "burst": {"type": ["integer", "null"], "minimum": 1},
    }
    rule = {
        "type": "object",
        "required": ["name", "scope", "limit", "window"],
        "additionalProperties": False,
        "properties": {
            "name": {"type": "string", "pattern": "^[A-Za-z0-9][A-Za-z0-9_.\\-]{0,63}$"},
            "scope": {"enum": list(SCOPES)},
            "endpoint": {**_STR_OR_NULL, "examples": ["GET /search*"]},
            "tier": _STR_OR_NULL,
            **limit,
            "shadow": {"type": ["boolean", "null"]},
        },
    }
    cost = {"type": "integer", "minimum": 1, "default": 1,
            "description": "at most the capacity of every rule it meets (else 422)"}
    peek = {"type": "boolean", "default": False,
            "description": "answer what the check would decide, consuming nothing"}
    key_check = {
        "type": "object", "required": ["key", "rule"], "additionalProperties": False,
        "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 4096},
                       "rule": {"oneOf": [
                           {"type": "string"},
                           {"type": "array", "items": {"type": "string"}, "minItems": 1,
                            "maxItems": 16, "description": "several rules on the key, all "
                            "or nothing"}]},
                       "cost": cost, "peek": peek}}
    inline_check = {
        "type": "object", "required": ["key", "limit", "window"], "additionalProperties": False,
        "description": "An inline limit, validated as a rule of the rules file is (no name: "
                       "the answer's rule is null)",
        "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 4096,
                               "examples": ["user:42:GET:/search"]},
                       **limit, "cost": cost, "peek": peek}}
    named_limit = {"type": "object", "required": ["limit", "window"],
                   "additionalProperties": False,
                   "properties": {**limit, "name": {
                       "type": "string", "description": "part of the counters' identity: "
                       "two limits with equal parameters and different names count apart"}}}
    limits_check = {
        "type": "object", "required": ["key", "limits"], "additionalProperties": False,
        "description": "Several inline limits on one key, all or nothing: consumed only "
                       "when every limit admits",
        "properties": {"key": {"type": "string", "minLength": 1, "maxLength": 4096},
                       "limits": {"type": "array", "minItems": 1, "maxItems": 16,
                                  "items": named_limit},
                       "cost": cost, "peek": peek}}
    attr_check = {
        "type": "object", "additionalProperties": False,
        "properties": {"user": _STR_OR_NULL, "api_key": _STR_OR_NULL, "ip": _STR_OR_NULL,
                       "method": _STR_OR_NULL, "path": _STR_OR_NULL, "tier": _STR_OR_NULL,
                       "cost": cost}}
    check = {"description": "Key + rule, key + an inline limit, key + several inline "
                            "limits, or request attributes that the rules match.",
             "oneOf": [key_check, inline_check, limits_check, attr_check]}
    keyed: list[dict[str, Any]] = [key_check, inline_check, limits_check]
    reset_body = {"description": "A key and its rules (key + rule, key + an inline limit, "
                                 "or key + limits)",
                  "oneOf": [{**c, "properties": {n: p for n, p in c["properties"].items()
                                                 if n not in ("cost", "peek")}}
                            for c in keyed]}
    result = {
        "type": "object",
        "required": ["allowed", "limit", "remaining", "reset_after", "retry_after", "rule",
                     "shadow", "degraded", "reset"],
        "properties": {
            "allowed": {"type": "boolean"},
            "limit": {"type": ["integer", "null"]},
            "remaining": {"type": ["integer", "null"]},
            "reset_after": {"type": "number",
                            "description": "seconds until the quota is fully restored"},
            "reset": {"type": "integer",
                      "description": "when the quota is fully restored: epoch seconds, "
                                     "rounded up (the current second when no rule applied)"},
            "retry_after": {"type": "number"},
            "rule": _STR_OR_NULL,
            "shadow": {"type": "boolean", "description": "the answer came from a shadow rule"},
            "degraded": {"type": "boolean"},
            "shadow_denied": {"type": "array", "items": {"type": "string"}},
            "rules": {"type": "array", "items": {"type": "string"},
                      "description": "every rule that matched"},
        },
    }
    ruleset = {"type": "object", "required": ["rules"],
               "properties": {"version": {"type": "integer"},
                              "rules": {"type": "array", "items": _ref("Rule")}}}
    error = {"type": "object", "required": ["error", "status"],
             "properties": {"error": {"type": "string"}, "status": {"type": "integer"},
                            "field": {"type": "string"},
                            "problems": {"type": "array", "items": {"type": "object"}}}}
    admin: list[dict[str, list[str]]] = [{"bearer": []}]
    etag = {"ETag": {"schema": {"type": "string"}, "description": '"<version>"'}}
    return {
        "openapi": "3.1.0",
        "info": {"title": "stormguard rate-limit service", "version": "1"},
        "paths": {
            "/v1/check": {"post": {
                "summary": "May this request pass? (consumes quota when allowed)",
                "requestBody": _json_body(_ref("Check")),
                "responses": {"200": {**_answer("The decision (also as rate-limit headers)",
                                                _ref("CheckResult")),
                                      "headers": _RATE_LIMIT_HEADERS},
                              "404": _answer("Unknown rule", _ref("Error")), **_ERRORS}}},
            "/v1/check/batch": {"post": {
                "summary": "Many independent checks in one request (at most 1000, and at "
                           "most 500,000 rule evaluations (checks x rules) and 10,000 "
                           "matched (check, rule) pairs: else 422)",
                "requestBody": _json_body({"type": "object", "required": ["checks"],
                                           "properties": {"checks": {
                                               "type": "array", "maxItems": 1000,
                                               "items": _ref("Check")}}}),
                "responses": {"200": _answer("One result per check, in order", {
                    "type": "object", "properties": {"results": {
                        "type": "array", "items": _ref("CheckResult")}}}),
                    "404": _answer("Unknown rule", _ref("Error")), **_ERRORS}}},
            "/v1/reset": {"post": {
                "summary": "Forget a key's counters of the given rules (control plane)",
                "security": admin, "requestBody": _json_body(reset_body),
                "responses": {"200": _answer("Reset", {
                    "type": "object", "properties": {
                        "reset": {"type": "boolean"}, "key": {"type": "string"},
                        "rules": {"type": "array", "items": {"type": "string"}}}}),
                    "404": _answer("Unknown rule", _ref("Error")), **_ERRORS,
                    **_ADMIN_ERRORS}}},
            "/v1/rules": {
                "get": {"summary": "The rule set and its version", "security": admin,
                        "responses": {"200": {**_answer("Rules", _ref("RuleSet")),
                                              "headers": etag}, **_ADMIN_ERRORS}},
                "put": {"summary": "Replace the whole rule set atomically", "security": admin,
                        "parameters": [_IF_MATCH], "requestBody": _json_body(_ref("RuleSet")),
                        "responses": {"200": {**_answer("The new rules", _ref("RuleSet")),
                                              "headers": etag}, **_RULES_ERRORS,
                                      **_ADMIN_ERRORS}},
            },
            "/v1/rules/{name}": {
                "get": {"summary": "One rule", "security": admin, "parameters": [_NAME],
                        "responses": {"200": _answer("The rule"),
                                      "404": _answer("Unknown rule", _ref("Error")),
                                      **_ADMIN_ERRORS}},
                "put": {"summary": "Create or replace one rule", "security": admin,
                        "parameters": [_NAME, _IF_MATCH], "requestBody": _json_body(_ref("Rule")),
                        "responses": {"200": _answer("Replaced"), "201": _answer("Created"),
                                      **_ERRORS, **_ADMIN_ERRORS}},
                "delete": {"summary": "Delete one rule", "security": admin,
                           "parameters": [_NAME, _IF_MATCH],
                           "responses": {"200": _answer("Deleted"),
                                         "404": _answer("Unknown rule", _ref("Error")),
                                         **_ADMIN_ERRORS}},
            },
            # nginx's subrequest keeps the original method unless proxy_method GET: every
            # method answers the same
            "/v1/auth": {method: {
                "summary": "nginx auth_request: may the original request pass? (the "
                           "X-Original-* / X-Real-IP / X-Stormguard-* headers are believed "
                           "only from trusted proxies)",
                "parameters": [{"name": h, "in": "header", "required": False,
                                "schema": {"type": "string"}} for h in (
                                    "X-Original-Method", "X-Original-URI", "X-Real-IP",
                                    "X-Stormguard-User", "X-Stormguard-Api-Key",
                                    "X-Stormguard-Tier")],
                "responses": {"204": {"description": "Allowed",
                                      "headers": _RATE_LIMIT_HEADERS},
                              "403": {**_answer("Rate limited (Retry-After)", _ref("Error")),
                                      "headers": _RATE_LIMIT_HEADERS},
                              "400": _answer("X-Real-IP is not an address", _ref("Error"))}}
                for method in ("get", "head", "post", "put", "patch", "delete", "options")},
            "/healthz": {"get": {"summary": "The process is up",
                                 "responses": {"200": _answer("ok")}}},
            "/readyz": {"get": {"summary": "The store answers",
                                "responses": {"200": _answer("ready"),
                                              "503": _answer("store unreachable")}}},
            "/v1/top": {"get": {
                "summary": "The most-denied keys (a bounded space-saving sketch)",
                "parameters": [{"name": "n", "in": "query", "required": False,
                                "schema": {"type": "integer", "minimum": 1,
                                           "maximum": 1000, "default": 20}}],
                "responses": {"200": _answer("Keys, highest denial count first", {
                    "type": "object", "required": ["keys", "held", "capacity", "denials"],
                    "properties": {
                        "keys": {"type": "array", "items": {
                            "type": "object", "required": ["key", "count", "error", "rules"],
                            "properties": {
                                "key": {"type": "string"},
                                "count": {"type": "integer",
                                          "description": "denials (an upper bound)"},
                                "error": {"type": "integer",
                                          "description": "count - error is a lower bound"},
                                "rules": {"type": "array", "items": {"type": "string"}}}}},
                        "held": {"type": "integer"}, "capacity": {"type": "integer"},
                        "denials": {"type": "integer"}}}),
                    "422": _answer("n out of range", _ref("Error"))}}},
            "/v1/stats": {"get": {"summary": "The dashboard's figures (cumulative counters)",
                                  "responses": {"200": _answer("Figures", {"type": "object"})}}},
            "/dashboard": {"get": {"summary": "The live dashboard (one HTML page)",
                                   "responses": {"200": {"description": "HTML",
                                                         "content": {"text/html": {}}}}}},
            "/metrics": {"get": {"summary": "Prometheus metrics",
                                 "responses": {"200": {"description": "text format",
                                                       "content": {"text/plain": {}}}}}},
        },
        "components": {
            "schemas": {"Rule": rule, "Check": check, "CheckResult": result,
                        "RuleSet": ruleset, "Error": error},
            "securitySchemes": {"bearer": {"type": "http", "scheme": "bearer"}},
        },
    }


def openapi_document() -> dict[str, Any]:
    """The OpenAPI document served at ``/openapi.json``."""
    return _document()
