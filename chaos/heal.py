"""After every scenario: every toxic removed, every paused process continued, every role back up — and checked.

Before it resets the proxies, the faults still in force are verified once more (``NetworkFaults.verify_at_heal``):
what the heal itself changes is the harness's own change, never taken for tampering."""

from __future__ import annotations

import signal
import time


class HealError(RuntimeError):
    pass


def heal_all(supervisor, toxiproxy, expected_running: set[str], history=None, stack=None,
             timeout: float = 30.0) -> list[str]:
    """Undo every fault and verify; returns what had to be repaired. Raises HealError if it cannot verify."""
    repaired: list[str] = []
    if toxiproxy is not None:
        guard = getattr(toxiproxy, "guard", None)  # chaos/network.py: what the harness set, checked once more
        if guard is not None:
            guard.verify_at_heal()
        if not toxiproxy.is_clean():
            repaired.append("toxiproxy had toxics or disabled proxies")
        toxiproxy.reset()
    if stack is not None:
        names = stack.service_names() if hasattr(stack, "service_names") else ("postgres", "rabbitmq", "s3")
        for service in names:  # a RabbitMQ cluster's every node among them
            if not stack.alive(service):
                repaired.append(f"service {service} was down")
                stack.restart(service)
    for name, instance in supervisor.instances.items():
        if instance.alive() and instance.paused:
            supervisor.signal(name, signal.SIGCONT)
            repaired.append(f"{name} was paused")
        if instance.armed and name in expected_running:
            supervisor.restart(name, {"FAILPOINTS": ""})
            repaired.append(f"{name} was armed")
        elif name in expected_running and supervisor.ensure_running(name, {"FAILPOINTS": ""}):
            repaired.append(f"{name} was down")
    deadline = time.monotonic() + timeout
    problems = []
    while time.monotonic() < deadline:
        problems = supervisor.problems(expected_running)
        if toxiproxy is not None and not toxiproxy.is_clean():
            problems.append("toxiproxy not clean")
        if stack is not None:
            problems += [f"service {s} down" for s in ("postgres", "rabbitmq", "s3") if not stack.alive(s)]
        if not problems:
            break
        for name in supervisor.instances:
            if name in expected_running:
                supervisor.ensure_running(name, {"FAILPOINTS": ""})
        time.sleep(0.3)
    if history is not None:
        history.append("phase", name="healed", repaired=repaired, problems=problems)
    if problems:
        raise HealError("; ".join(problems))
    return repaired
