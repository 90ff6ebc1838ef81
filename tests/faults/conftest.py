"""The fault suite reuses the gateway suite's fixtures (real upstreams, gateways as built)."""

from tests.gateway.conftest import make_gateway, sim, stack_model  # noqa: F401  (fixtures by name)
