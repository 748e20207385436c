"""Inbound rate limiting: the quota (Rule), the verdict (Decision), the limiters,
the algorithms and rules as data."""
