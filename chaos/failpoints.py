"""Failpoint arming: restart the role that hosts a failure window with FAILPOINTS set (CONTRACT §7)."""

from __future__ import annotations


def failpoints_value(arms: dict[str, str]) -> str:
    """{"after_commit_before_ack": "1*crash"} -> "after_commit_before_ack=1*crash"."""
    return ";".join(f"{window}={spec}" for window, spec in arms.items())


class FailpointFaults:
    def __init__(self, supervisor, history):
        self.supervisor = supervisor
        self.history = history

    def arm(self, instance: str, window: str, spec: str = "1*crash") -> None:
        self.history.append("fault", action="failpoint", phase="arm", role=instance, window=window, spec=spec)
        self.supervisor.restart(instance, {"FAILPOINTS": failpoints_value({window: spec})})

    def disarm(self, instance: str) -> None:
        """Restart without failpoints (only if it is still armed)."""
        if self.supervisor.instances[instance].armed:
            self.history.append("fault", action="failpoint", phase="disarm", role=instance)
            self.supervisor.restart(instance, {"FAILPOINTS": ""})
