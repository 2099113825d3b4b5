"""Exit codes a CI can act on, and the one error type of the commands (:class:`HarnessError`), with the grader's own
infrastructure failing as its exit-3 kind.

- 0: valid;
- 1: invalid, or tampered (the harness's faults were changed under the run: a failure, never a pass);
- 2: unknown or not proven (the grade cannot vouch for the implementation either way), or a usage error;
- 3: the grader's own infrastructure failed — a service of the stack did not start, the disk filled, the isolation
  of a submission could not be set up. Nothing is said about the implementation: rerun the job.

An infrastructure failure is retried once by itself (:func:`retry_once`) before it is reported as exit 3.
"""

from __future__ import annotations

import errno

EXIT_VALID, EXIT_INVALID, EXIT_UNKNOWN, EXIT_INFRASTRUCTURE = 0, 1, 2, 3

# A verdict (a grade's, a scenario's, a checklist row's) -> the exit code it asks for.
EXIT_BY_VERDICT = {"valid": EXIT_VALID, "pass": EXIT_VALID, "invalid": EXIT_INVALID, "fail": EXIT_INVALID,
                   "tampered": EXIT_INVALID, "unknown": EXIT_UNKNOWN, "not proven": EXIT_UNKNOWN,
                   "missing": EXIT_UNKNOWN}

# Disk full, quota, no memory for a process, too many files: the machine, not the submission.
INFRASTRUCTURE_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.ENOMEM, errno.EMFILE, errno.ENFILE}


class HarnessError(Exception):
    """The one error type of the commands: what went wrong, said in one line, and the exit code it asks for. The
    CLI (harness/cli.py ``main``) prints ``harness: <message>`` on stderr and exits with :attr:`exit_code`."""

    exit_code = EXIT_UNKNOWN


class UsageError(HarnessError, ValueError):
    """The command was asked for something it cannot do (a bad option, an adapter refused, an unknown name): exit 2,
    before anything is started."""


class InfrastructureError(HarnessError, RuntimeError):
    """The grader's own infrastructure failed (not the implementation under test): exit code 3."""

    exit_code = EXIT_INFRASTRUCTURE

    def __init__(self, what: str, cause: BaseException | None = None):
        text = what if cause is None else f"{what}: {type(cause).__name__}: {cause}"
        super().__init__(text)
        self.what = what
        self.cause = cause


def is_infrastructure(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) is the grader's infrastructure failing."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if isinstance(exc, InfrastructureError):
            return True
        if type(exc).__name__ == "IsolationError":  # harness/isolation.py: the sandbox could not be set up
            return True
        if isinstance(exc, OSError) and exc.errno in INFRASTRUCTURE_ERRNOS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def as_infrastructure(exc: BaseException, what: str) -> InfrastructureError:
    return exc if isinstance(exc, InfrastructureError) else InfrastructureError(what, exc)


def exit_code(verdict: str) -> int:
    """The exit code of one verdict; anything not known (an error, a status not graded) is 2."""
    return EXIT_BY_VERDICT.get(verdict, EXIT_UNKNOWN)


def worst_exit(codes) -> int:
    """One exit code for several: 3 (infrastructure) over 1 (a failure) over 2 (unknown) over 0."""
    codes = list(codes)
    for code in (EXIT_INFRASTRUCTURE, EXIT_INVALID, EXIT_UNKNOWN):
        if code in codes:
            return code
    return EXIT_VALID


def retry_once(action, say=print, what: str = "the grade"):
    """Run ``action()``; an infrastructure failure is retried once, then raised (as InfrastructureError)."""
    try:
        return action()
    except BaseException as exc:  # noqa: BLE001 - only infrastructure failures are retried
        if not is_infrastructure(exc):
            raise
        say(f"harness: infrastructure failure in {what} ({type(exc).__name__}: {exc}); retrying once")
    try:
        return action()
    except BaseException as exc:  # noqa: BLE001
        if is_infrastructure(exc):
            raise as_infrastructure(exc, f"{what} failed twice on the grader's infrastructure") from exc
        raise
