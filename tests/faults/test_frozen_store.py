"""A call blocked on a frozen leader's TCPStore is cut loose, whatever TCPStore's own timeouts say."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from datetime import timedelta

import pytest
from torch.distributed import TCPStore

from torch_mingle._store import abort_connections_to

pytestmark = pytest.mark.integration

SERVER = """
import sys, time
from torch.distributed import TCPStore
store = TCPStore("127.0.0.1", 0, None, True, wait_for_workers=False)
print(store.port, flush=True)
time.sleep(600)
"""


def test_a_call_blocked_on_a_frozen_store_returns_once_its_connections_are_cut():
    server = subprocess.Popen([sys.executable, "-c", SERVER], stdout=subprocess.PIPE, text=True)
    wake_r, wake_w = socket.socketpair()  # a Unix socket in the process, as the loop has one
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        client = TCPStore("127.0.0.1", port, None, False, timeout=timedelta(seconds=2))
        client.set("k", "v")
        os.kill(server.pid, signal.SIGSTOP)  # frozen: the kernel still holds its connections open
        outcome: dict[str, object] = {}

        def blocked_get() -> None:
            started = time.monotonic()
            try:
                client.get("k")
                outcome["result"] = "returned"
            except Exception as exc:  # what TCPStore raises when its socket is shut down
                outcome["result"] = type(exc).__name__
            outcome["after"] = time.monotonic() - started

        thread = threading.Thread(target=blocked_get, daemon=True)
        thread.start()
        thread.join(timeout=3.0)
        assert thread.is_alive(), "the get did not block on the frozen server: nothing to test"
        assert abort_connections_to("127.0.0.1", [port]) >= 1
        thread.join(timeout=5.0)
        assert not thread.is_alive(), "the blocked call was not cut loose"
        assert outcome["result"] != "returned"
        assert abort_connections_to("127.0.0.1", [port + 1]) == 0  # other ports: untouched
    finally:
        os.kill(server.pid, signal.SIGKILL)  # SIGKILL ends a stopped process too
        server.wait(timeout=30)
        wake_r.close()
        wake_w.close()
