"""Process faults: SIGKILL, SIGSTOP and SIGCONT of a role's whole process group."""

from __future__ import annotations

import signal


class ProcessFaults:
    def __init__(self, supervisor, history):
        self.supervisor = supervisor
        self.history = history

    def sigkill(self, instance: str, **context) -> None:
        self.history.append("fault", action="sigkill", phase="start", role=instance,
                            pid=self.supervisor.instances[instance].pid, **context)
        self.supervisor.signal(instance, signal.SIGKILL)
        self.supervisor.wait_exit(instance, 5)

    def sigstop(self, instance: str, **context) -> None:
        self.history.append("fault", action="sigstop", phase="start", role=instance,
                            pid=self.supervisor.instances[instance].pid, **context)
        self.supervisor.signal(instance, signal.SIGSTOP)

    def sigcont(self, instance: str, **context) -> None:
        self.supervisor.signal(instance, signal.SIGCONT)
        self.history.append("fault", action="sigcont", phase="end", role=instance,
                            pid=self.supervisor.instances[instance].pid, **context)
