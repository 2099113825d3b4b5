"""Where the stack puts data and sockets, and how its waits end: no service is started here."""
from __future__ import annotations

import os
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from harness.stack import Stack
from harness.stack.data_dir import MARKER, UNIX_SOCKET_PATH_MAX, remove_data_dir, short_temp_root, socket_path
from harness.stack.ports import NotReady, ServiceExited, StartAbandoned, wait_until
from harness.stack.process import ServiceProcess, signals_deferred


def deep_folder(base: Path, at_least: int) -> Path:
    folder = base
    while len(str(folder)) < at_least:
        folder = folder / "a-rather-long-folder-name-like-a-ci-checkout"
    return folder


@pytest.fixture
def deep_tmpdir(tmp_path, monkeypatch) -> Path:
    """$TMPDIR deep enough that sockets under it could not be bound (as on some CI runners)."""
    folder = deep_folder(tmp_path / "tmpdir", 200)
    folder.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(folder))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile caches the folder it chose
    return folder


def test_socket_paths_are_short_whatever_the_run_dir(tmp_path, deep_tmpdir):
    run_dir = deep_folder(tmp_path / "run", 300)
    stack = Stack.create(run_dir)
    try:
        sockets = stack.unix_socket_paths()
        assert len(sockets) == 3  # PostgreSQL's, and SeaweedFS's S3 and filer sockets
        for path in sockets:
            assert len(os.fsencode(path)) <= UNIX_SOCKET_PATH_MAX, path
            assert path.is_relative_to(stack.data_dir), path
        assert not stack.data_dir.is_relative_to(run_dir)
        assert not stack.data_dir.is_relative_to(deep_tmpdir), "a deep $TMPDIR must not be used"
        assert len(str(stack.data_dir)) <= 24, stack.data_dir
        assert stack.data_dir.stat().st_mode & 0o777 == 0o711, "postgres must traverse it; nobody may list it"
    finally:
        stack.stop()  # nothing was started: removes the data folder
    assert not stack.data_dir.exists()
    assert (run_dir / "stack.json").exists()


def test_short_tmpdir_is_used(tmp_path, monkeypatch):
    monkeypatch.setenv("TMPDIR", "/tmp")
    monkeypatch.setattr(tempfile, "tempdir", None)
    assert short_temp_root() == Path("/tmp")


def test_deep_tmpdir_falls_back_to_tmp(deep_tmpdir):
    assert short_temp_root() == Path("/tmp")


def test_an_overlong_socket_path_is_refused_before_any_start(tmp_path):
    with pytest.raises(ValueError, match="longer than 107 bytes"):
        socket_path(deep_folder(tmp_path, 120), "s3.sock")


def test_only_a_marked_data_folder_is_removed(tmp_path):
    unmarked = tmp_path / "someone-elses"
    unmarked.mkdir()
    assert remove_data_dir(unmarked) is False and unmarked.exists()
    (unmarked / MARKER).write_text("x\n")
    assert remove_data_dir(unmarked) is True and not unmarked.exists()


def test_wait_ends_at_once_when_the_process_exits(tmp_path):
    process = ServiceProcess(name="dies", argv=["sh", "-c", "echo 'FATAL: bad setting'; exit 3"],
                             log_path=tmp_path / "dies.log").start()
    began = time.monotonic()
    with pytest.raises(ServiceExited) as raised:
        wait_until(lambda: False, 60, "Dying service", process=process, on_fail=process.tail)
    assert time.monotonic() - began < 2
    assert "Dying service exited (code 3)" in str(raised.value)
    assert "FATAL: bad setting" in str(raised.value)


def test_wait_ends_when_abandoned():
    abandon = threading.Event()
    threading.Timer(0.2, abandon.set).start()
    began = time.monotonic()
    with pytest.raises(StartAbandoned):
        wait_until(lambda: False, 60, "Slow service", abandon=abandon)
    assert time.monotonic() - began < 2


def test_wait_times_out_naming_the_service():
    with pytest.raises(NotReady, match="Never ready not ready after 0s"):
        wait_until(lambda: False, 0.1, "Never ready")


def test_signals_during_cleanup_are_held_then_raised():
    finished = False
    with pytest.raises(KeyboardInterrupt):
        with signals_deferred():
            os.kill(os.getpid(), signal.SIGINT)
            time.sleep(0.05)  # the handler runs here, and must not interrupt the cleanup
            finished = True
    assert finished
    assert signal.getsignal(signal.SIGINT) is signal.default_int_handler


def test_cli_turns_sigterm_into_a_clean_interrupt(tmp_path):
    """Default SIGTERM ends Python without running `finally`; the CLI makes it a KeyboardInterrupt."""
    import subprocess
    script = ("import os, signal, time\n"
              "from harness.stack.process import raise_keyboard_interrupt_on_sigterm\n"
              "raise_keyboard_interrupt_on_sigterm()\n"
              "try:\n    os.kill(os.getpid(), signal.SIGTERM); time.sleep(5)\n"
              "finally:\n    print('cleanup ran')\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    assert "cleanup ran" in result.stdout and "KeyboardInterrupt" in result.stderr


def test_cli_interrupts_on_ctrl_c_even_when_started_with_sigint_ignored(tmp_path):
    """A background start (nohup, a CI script, `cmd &`) hands SIGINT over ignored; the CLI sets its own handler
    rather than assume Python's default, so a grader's Ctrl-C still stops what it started."""
    import subprocess
    script = ("import os, signal, sys, time\n"
              "from harness import cli\n"
              "def wait(args):\n"
              "    try:\n        os.kill(os.getpid(), signal.SIGINT); time.sleep(5)\n"
              "    finally:\n        print('cleanup ran', flush=True)\n"
              "cli.build_parser = lambda: type('P', (), {'parse_args': lambda self, argv: "
              "type('A', (), {'func': staticmethod(wait)})()})()\n"
              "sys.exit(cli.main([]))\n")
    result = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    assert "cleanup ran" in result.stdout, result.stderr
    assert result.returncode == 2 and "interrupted" in result.stderr, result.stderr
