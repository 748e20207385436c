"""Gateways: Envoy's rate-limit service (gRPC, envoyproxy/ratelimit's configuration
format). nginx's ``auth_request`` is an HTTP route of the service (``GET /v1/auth``).

:mod:`.envoy` (the configuration and its lookup) and :mod:`.rls` (the semantics) need no
gRPC; :mod:`.grpc` (the server) needs the ``grpc`` extra (grpcio, xds-protos).
"""

from __future__ import annotations

from .envoy import EnvoyConfig, EnvoyConfigError, EnvoyLimit, load_envoy_config, loads_envoy_config
from .rls import DescriptorStatus, EnvoyChecker, EnvoyResult, ShadowOverLimit, UnknownDescriptor

__all__ = ["DescriptorStatus", "EnvoyChecker", "EnvoyConfig", "EnvoyConfigError",
           "EnvoyLimit", "EnvoyResult", "ShadowOverLimit", "UnknownDescriptor",
           "load_envoy_config", "loads_envoy_config"]
