"""Private instances of the real services, on free loopback ports: logs in a run directory, data in a short
temporary folder removed when the stack stops."""
from .stack import SERVICES, ServiceUrls, Stack, Tenant, stop_from_state
from .tools import MissingTool

__all__ = ["SERVICES", "MissingTool", "ServiceUrls", "Stack", "Tenant", "stop_from_state"]
