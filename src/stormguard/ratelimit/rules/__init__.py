"""Rules as data: the rules file, request matching and the per-request check.

Modules: :mod:`.model` (the fields, validation, :class:`RuleSet`), :mod:`.matching`
(scopes, endpoint globs, tiers, the counter key), :mod:`.check` (the check flow and its
drivers). Everything is importable from here (and from ``stormguard.ruleset``).

A rules file (YAML) is a list of rules, or a mapping with ``rules:`` (and optionally
``version:``)::

    rules:
      - name: search
        scope: user              # user | api_key | ip | global
        endpoint: "GET /search*" # METHOD /path-glob; "*" or no method = any method
        tier: free               # optional: only requests of this tier
        limit: 100
        window: 60               # seconds, or "1m", "30s", "2 hours"
        algorithm: sliding_window_counter
        burst: null              # bucket algorithms only
        shadow: false            # dry run: decide and count, always allow

Several rules may match one request; all enforced (non-shadow) rules must admit it.

**Keys.** The counter key of a matched rule is ``"<scope>:<value>"`` (``"user:42"``,
``"ip:10.0.0.1"``, ``"api_key:k1"``) or ``"global"``. Each rule is turned into a
:class:`stormguard.Rule` carrying its name, so two rules on the same key never share
counters (the name is part of the rule id), and ``{"key": "user:42", "rule": "search"}``
on the service hits the same counter as a request of user 42 matched by ``search``.

**All-or-nothing.** Matched rules are grouped by key. One group is one ``hit_all``:
atomic on every store. Several groups (say a per-user and a per-IP rule) cannot be
one atomic store call, so the check first *peeks* every group but the first (consuming
nothing; a denial there ends the check with nothing consumed), then ``hit_all``\\ s
the groups in order, stopping at the first denial. Limits are never exceeded (each
``hit_all`` is atomic); only when concurrent requests race between the peek and the
hit can a denied request have been charged to an earlier group.

**Shadow rules** are evaluated only when the enforced rules admit the request (a
denied request consumes nothing anywhere), each on its own (``hit``), and never change
the answer; their denials are reported in ``shadow_denied``.
"""

from __future__ import annotations

from stormguard.ratelimit.rules.check import (
    CheckResult,
    Flow,
    Matched,
    Plan,
    Step,
    acheck_plan,
    apeek_plan,
    check_flow,
    check_plan,
    peek_plan,
    run_sync,
)
from stormguard.ratelimit.rules.matching import METHODS, SCOPES, Matcher, RequestAttrs
from stormguard.ratelimit.rules.model import (
    FIELDS,
    MAX_RULES,
    RuleProblem,
    RulesError,
    RuleSet,
    RuleSpec,
)

__all__ = [
    "FIELDS",
    "MAX_RULES",
    "METHODS",
    "SCOPES",
    "CheckResult",
    "Flow",
    "Matched",
    "Matcher",
    "Plan",
    "RequestAttrs",
    "RuleProblem",
    "RuleSet",
    "RuleSpec",
    "RulesError",
    "Step",
    "acheck_plan",
    "apeek_plan",
    "check_flow",
    "check_plan",
    "peek_plan",
    "run_sync",
]
