"""One real `aenv server` for the Python suite, and the E2B Python SDK.

The SDK comes from AENV_PYTHON_E2B: a directory holding it (with a lib/
folder, as ../shared/python-e2b beside the repository, the default) or
`pip` for an SDK installed with pip. A missing SDK skips the suite on a
laptop and fails it when AENV_REQUIRE_PRIVILEGED=1, as a missing server
prerequisite does.

The server gets its own netns tag, sandbox CIDR and port (zqpy,
10.235.0.0/16, from 18185) so that it never meets the JS suites' servers.
"""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest
import urllib.request

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
REQUIRED = os.environ.get("AENV_REQUIRE_PRIVILEGED") == "1"

TAG, CIDR, PORT_HINT = "zqpy", "10.235.0.0/16", 18185
PORT_MIN, PORT_MAX = 18100, 18199
START_TIMEOUT_S, STOP_GRACE_S = 90, 30


def unavailable(why):
    """Fails under AENV_REQUIRE_PRIVILEGED=1, skips otherwise."""
    if REQUIRED:
        raise RuntimeError(why + " (AENV_REQUIRE_PRIVILEGED=1: this is a failure)")
    raise unittest.SkipTest(why)


def load_sdk():
    """Puts the SDK named by AENV_PYTHON_E2B on sys.path and imports it."""
    where = os.environ.get("AENV_PYTHON_E2B") or os.path.join(REPO, "..", "shared", "python-e2b")
    if where != "pip":
        lib = os.path.join(os.path.abspath(where), "lib")
        if not os.path.isdir(os.path.join(lib, "e2b")):
            unavailable(f"the E2B Python SDK is not at {lib} (AENV_PYTHON_E2B names a directory with lib/e2b, or pip)")
        sys.path.insert(0, lib)
    try:
        import e2b  # noqa: F401
        import e2b_code_interpreter  # noqa: F401
    except ImportError as err:
        unavailable(f"importing the E2B Python SDK ({where}): {err} (scripts/install-deps.sh installs its Debian dependencies)")


def _port_free(port):
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def _free_port():
    span = PORT_MAX - PORT_MIN + 1
    for i in range(span):
        port = PORT_MIN + (PORT_HINT - PORT_MIN + i) % span
        if _port_free(port):
            return port
    raise RuntimeError(f"no free port in {PORT_MIN}-{PORT_MAX}")


class Server:
    """An aenv server with the code interpreter, its key in E2B_API_KEY."""

    def start(self):
        bin_dir = os.environ.get("AENV_BIN_DIR")
        base = os.environ.get("AENV_BASE_ROOTFS")
        ci = os.environ.get("AENV_CODE_INTERPRETER_ROOTFS")
        if not bin_dir or not os.access(os.path.join(bin_dir, "aenv"), os.X_OK):
            unavailable("AENV_BIN_DIR does not hold the aenv binary (make build)")
        if not base or not os.path.exists(os.path.join(base, "bin", "bash")):
            unavailable("AENV_BASE_ROOTFS is not a built base root filesystem (make base)")
        if not ci or not os.path.isdir(os.path.join(ci, "usr")):
            unavailable("AENV_CODE_INTERPRETER_ROOTFS is not a built code-interpreter root filesystem (make code-interpreter)")
        if os.getuid() != 0:
            unavailable("the Python e2e suite runs sandboxes: it needs root")
        self.tmp = tempfile.mkdtemp(prefix=f"aenv-e2e-{TAG}-")
        self.data_dir = os.path.join(self.tmp, "data")
        self.log_path = os.path.join(self.tmp, "server.log")
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        args = [os.path.join(bin_dir, "aenv"), "server", "--listen", f"127.0.0.1:{self.port}",
                "--data-dir", self.data_dir, "--run-dir", os.path.join(self.tmp, "run"),
                "--base-rootfs", base, "--code-interpreter-rootfs", ci,
                "--netns-tag", TAG, "--sandbox-cidr", CIDR, "--log-level", "debug", "--on-stop", "kill"]
        if os.environ.get("AENV_RUNSC"):
            args += ["--runsc", os.environ["AENV_RUNSC"]]
        env = {k: v for k, v in os.environ.items() if k not in ("AENV_API_KEY", "AENV_CODE_INTERPRETER_ROOTFS")}
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env)
        # An interrupted run must not leave the server (and its sandboxes)
        # behind: SIGTERM makes it kill them (--on-stop kill).
        atexit.register(self._terminate)
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"aenv server exited during start-up ({self.proc.returncode}):\n{self.tail()}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.monotonic() > deadline:
                self.stop()
                raise RuntimeError(f"aenv server did not answer /health within {START_TIMEOUT_S} s:\n{self.tail()}")
            time.sleep(0.2)
        with open(os.path.join(self.data_dir, "secrets", "api-key")) as f:
            self.api_key = f.read().strip()
        os.environ.update(E2B_API_URL=self.url, E2B_SANDBOX_URL=self.url, E2B_API_KEY=self.api_key)
        for k in ("E2B_DEBUG", "E2B_DOMAIN", "E2B_ACCESS_TOKEN"):
            os.environ.pop(k, None)

    def api(self, method, path, body=None):
        """A raw API request: (status, decoded JSON or None)."""
        req = urllib.request.Request(self.url + path, method=method, headers={"X-API-Key": self.api_key},
                                     data=None if body is None else json.dumps(body).encode())
        try:
            with urllib.request.urlopen(req, timeout=30) as r:
                raw = r.read()
                return r.status, json.loads(raw) if raw else None
        except urllib.error.HTTPError as err:
            return err.code, None

    def tail(self, lines=60):
        try:
            with open(self.log_path, errors="replace") as f:
                return "".join(f.readlines()[-lines:])
        except OSError as err:
            return f"(no log: {err})"

    def _terminate(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()

    def stop(self):
        """SIGTERM, then SIGKILL after the grace; the server must exit 0.
        setUpModule's caller stops it too when start-up fails half-way."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_GRACE_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"aenv server did not stop within {STOP_GRACE_S} s:\n{self.tail()}")
        if self.proc.returncode != 0:
            raise RuntimeError(f"aenv server exited {self.proc.returncode}:\n{self.tail()}")


def wait_for(fn, timeout=20.0, interval=0.25, what="condition"):
    """Polls fn until it returns a truthy value."""
    deadline = time.monotonic() + timeout
    last = None
    while True:
        try:
            v = fn()
            if v:
                return v
        except Exception as err:  # noqa: BLE001 - reported at the deadline
            last = err
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}" + (f": {last!r}" if last else ""))
        time.sleep(interval)
