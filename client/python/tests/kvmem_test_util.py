"""Shared by the Python client tests: a real kvmem-server in a temp dir.

The binaries come from $KVMEM_SERVER and $KVMEM_CLI (ctest sets them to the
built targets), else build/bin/ of the source tree.
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import time
from typing import Optional

_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))


def binary(env: str, name: str) -> str:
    path = os.environ.get(env) or os.path.join(_ROOT, "build", "bin", name)
    if not os.access(path, os.X_OK):
        raise RuntimeError(f"{name} not found at {path} (set ${env})")
    return path


def server_binary() -> str:
    return binary("KVMEM_SERVER", "kvmem-server")


def cli_binary() -> str:
    return binary("KVMEM_CLI", "kvmem")


class Server:
    """kvmem-server on a free loopback port and a unix socket, with its data
    in a fresh temp dir removed on stop(). Use as a context manager."""

    def __init__(self, *extra_args: str, env: Optional[dict] = None) -> None:
        server = server_binary()  # Before the temp dir: a missing binary leaks nothing.
        self.dir = tempfile.mkdtemp(prefix="kvmem-pytest-")
        self.socket = os.path.join(self.dir, "kvmem.sock")
        port_file = os.path.join(self.dir, "port")
        self.log_path = os.path.join(self.dir, "server.log")
        self._log = open(self.log_path, "wb")
        try:
            self.proc = subprocess.Popen(
                [server, "--listen=127.0.0.1:0", f"--port_file={port_file}",
                 f"--data_dir={os.path.join(self.dir, 'data')}",
                 f"--unix_socket={self.socket}", "--log_level=warn", *extra_args],
                stdout=self._log, stderr=subprocess.STDOUT,
                env=None if env is None else {**os.environ, **env})
        except OSError:
            self._log.close()
            shutil.rmtree(self.dir, ignore_errors=True)
            raise
        deadline = time.monotonic() + 15
        self.port = 0
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()
                raise RuntimeError(f"kvmem-server exited with {self.proc.returncode}: "
                                   f"{self.log()}")
            try:
                with open(port_file) as f:
                    text = f.read()
                if text.endswith("\n") or text.strip().isdigit():
                    self.port = int(text)
            except (OSError, ValueError):
                pass
            if self.port and os.path.exists(self.socket):
                break
            time.sleep(0.02)
        else:
            self.stop()
            raise RuntimeError("kvmem-server did not start within 15 s")
        self.tcp = f"127.0.0.1:{self.port}"
        self.unix = f"unix:{self.socket}"

    def log(self) -> str:
        try:
            with open(self.log_path, errors="replace") as f:
                return f.read()[-4000:]
        except OSError:
            return ""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()
        shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()
