"""Schema-driven fuzz: schemathesis generates requests from /openapi.json and checks
every answer (no 5xx, documented status codes and content types, response schemas)."""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, settings
from schemathesis.checks import negative_data_rejection, positive_data_acceptance

from stormguard import AsyncRateLimiter, MemoryStore
from stormguard.service import create_app
from stormguard.testing import FakeClock
from tests.service.helpers import AUTH, RULES, TOKEN

app = create_app(AsyncRateLimiter(MemoryStore(clock=FakeClock())), RULES, admin_token=TOKEN)
schema = schemathesis.openapi.from_asgi("/openapi.json", app)


@schema.parametrize()
@settings(max_examples=15, deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
def test_api_conforms_to_its_schema(case: schemathesis.Case) -> None:
    # left out: positive_data_acceptance (a schema-valid cost can still exceed a rule's
    # capacity: 422, which no static schema can express) and negative_data_rejection
    # (a batch over maxItems is usually also over 64 KiB: 413, not in its list)
    case.call_and_validate(headers=AUTH, excluded_checks=[positive_data_acceptance,
                                                          negative_data_rejection])
