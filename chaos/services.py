"""Service faults: restart (or kill and later start) PostgreSQL, RabbitMQ or the S3 store."""

from __future__ import annotations

import time

from chaos.network import fault_index


# Services restarted cleanly rather than killed. RabbitMQ 3.10 (Debian's) loses a young quorum queue's Ra server
# when the node is SIGKILLed: the queue still exists after the restart but every consume and get times out (seen
# here for queues declared up to seconds before the kill). An implementation cannot defend against its broker
# losing the queue, so a kill would grade the broker; a clean stop still drops every connection, returns every
# unacked delivery and leaves publishes unconfirmed — everything the implementation must survive.
STOPPED_CLEANLY = frozenset({"rabbitmq"})


class ServiceFaults:
    def __init__(self, stack, history):
        self.stack = stack
        self.history = history

    def restart(self, service: str, down_seconds: float = 0.0, sleep=None) -> float:
        """Kill (or cleanly stop) the service, keep it down ``down_seconds``, start it again; returns seconds until
        ready."""
        how = "stop" if service in STOPPED_CLEANLY else "kill"
        step = fault_index()
        self.history.append("fault", action="restart_service", phase="start", service=service, how=how,
                            **({"fault": step} if step is not None else {}))
        if how == "stop":
            self.stack.stop_service(service)
        else:
            self.stack.kill(service)
        (sleep or time.sleep)(down_seconds)
        took = self.stack.restart(service)
        self.history.append("fault", action="restart_service", phase="end", service=service,
                            ready_seconds=round(took, 3))
        return took
