"""Private instances of the real services, on free loopback ports, with data under a run directory."""
from .stack import SERVICES, ServiceUrls, Stack, Tenant, stop_from_state
from .tools import MissingTool

__all__ = ["SERVICES", "MissingTool", "ServiceUrls", "Stack", "Tenant", "stop_from_state"]
