"""The nemesis: faults against an implementation under test and its services, and their verified undoing."""

from .failpoints import FailpointFaults, failpoints_value
from .heal import HealError, heal_all
from .network import KINDS as NETWORK_FAULTS
from .network import NetworkFaults
from .process import ProcessFaults
from .services import ServiceFaults

__all__ = ["FailpointFaults", "HealError", "NETWORK_FAULTS", "NetworkFaults", "ProcessFaults", "ServiceFaults",
           "failpoints_value", "heal_all"]
