"""The Go example's own unit tests (`go test ./...`: failpoints, backoff, sniffing, image caps, worker decisions)
run with the suite, so `make test` covers both implementations."""

from __future__ import annotations

import os
import shutil
import subprocess

from harness.schemas import REPO_ROOT

GO_EXAMPLE = REPO_ROOT / "examples" / "go-pipeline"


def test_go_example_unit_tests_pass():
    go = shutil.which("go")
    assert go, "Go is required (scripts/bootstrap.sh builds the Go example with it)"
    done = subprocess.run([go, "test", "-count=1", "./..."], cwd=GO_EXAMPLE, capture_output=True, text=True,
                          timeout=600, env={**os.environ, "GOFLAGS": "-buildvcs=false"})
    print(done.stdout[-3000:])
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert "ok  " in done.stdout and "FAIL" not in done.stdout
