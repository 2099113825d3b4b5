"""Service faults: restart (or kill and later start) PostgreSQL, RabbitMQ or the S3 store."""

from __future__ import annotations


class ServiceFaults:
    def __init__(self, stack, history):
        self.stack = stack
        self.history = history

    def restart(self, service: str, down_seconds: float = 0.0, sleep=None) -> float:
        """Kill the service, keep it down ``down_seconds``, start it again; returns seconds until ready."""
        import time

        self.history.append("fault", action="restart_service", phase="start", service=service)
        self.stack.kill(service)
        (sleep or time.sleep)(down_seconds)
        took = self.stack.restart(service)
        self.history.append("fault", action="restart_service", phase="end", service=service,
                            ready_seconds=round(took, 3))
        return took
