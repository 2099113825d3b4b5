"""Process faults: SIGKILL, SIGSTOP and SIGCONT of a role's whole process group."""

from __future__ import annotations

import signal

from .network import fault_index


def _step(context: dict) -> dict:
    """The scenario step that sends the signal, named on its line (``fault``), so each step's ``happened`` finds its
    own; a signal sent outside a step's thread (the heal) names none."""
    index = fault_index()
    return context if "fault" in context or index is None else {**context, "fault": index}


class ProcessFaults:
    def __init__(self, supervisor, history):
        self.supervisor = supervisor
        self.history = history

    def sigkill(self, instance: str, **context) -> None:
        self.history.append("fault", action="sigkill", phase="start", role=instance,
                            pid=self.supervisor.instances[instance].pid, **_step(context))
        self.supervisor.signal(instance, signal.SIGKILL)
        self.supervisor.wait_exit(instance, 5)

    def sigstop(self, instance: str, **context) -> None:
        self.history.append("fault", action="sigstop", phase="start", role=instance,
                            pid=self.supervisor.instances[instance].pid, **_step(context))
        self.supervisor.signal(instance, signal.SIGSTOP)

    def sigcont(self, instance: str, **context) -> None:
        self.supervisor.signal(instance, signal.SIGCONT)
        self.history.append("fault", action="sigcont", phase="end", role=instance,
                            pid=self.supervisor.instances[instance].pid, **_step(context))
