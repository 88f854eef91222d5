"""The broker's JVM as a detached OS process: launch it, tell whether it lives, await its exit.

The JVM runs in its own session so it outlives the command that started it (a CLI call or
``resolve_bootstrap``) and isn't hit by that terminal's Ctrl-C. Processes launched by this
Python process are kept in ``_children`` so they are reaped, not left as zombies that still
look alive to ``kill(pid, 0)``.
"""

from __future__ import annotations

import os
import select
import signal
import subprocess
import time
from pathlib import Path

_children: dict[int, subprocess.Popen[bytes]] = {}


def launch(cmd: list[str], *, cwd: Path, output: Path) -> int:
    """Start ``cmd`` detached, stdout and stderr written to ``output``; return its pid."""
    with open(output, "wb") as out:
        proc = subprocess.Popen(
            cmd,
            cwd=cwd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    _children[proc.pid] = proc
    return proc.pid


def is_alive(pid: int, marker: str) -> bool:
    """Whether ``pid`` runs and is still our broker (its command line contains ``marker``).

    The marker check guards against a pid recycled by an unrelated process after the broker
    died; without procfs (macOS) the pid's existence is trusted.
    """
    child = _children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except FileNotFoundError:
        return not Path("/proc/self").exists()
    return marker.encode() in cmdline


def terminate(pid: int, marker: str, timeout: float) -> bool:
    """SIGTERM ``pid`` and await its exit, SIGKILL it if it outlives ``timeout`` seconds.

    Returns whether the process is gone.
    """
    for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
        if not is_alive(pid, marker):
            return True
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return True
        if wait_exit(pid, wait):
            return True
    return not is_alive(pid, marker)


def wait_exit(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to end; True if it did."""
    child = _children.get(pid)
    if child is not None:
        try:
            child.wait(timeout)
        except subprocess.TimeoutExpired:
            return False
        del _children[pid]
        return True
    if hasattr(os, "pidfd_open"):
        return _wait_pidfd(pid, timeout)
    return _poll_exit(pid, timeout)


def _wait_pidfd(pid: int, timeout: float) -> bool:
    """Linux: a pidfd turns readable when the process ends, so no polling is needed."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        readable, _, _ = select.select([fd], [], [], timeout)
    finally:
        os.close(fd)
    return bool(readable)


def _poll_exit(pid: int, timeout: float) -> bool:
    """Fallback without pidfd (macOS): check the pid with a deadline."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.1)
    return False
