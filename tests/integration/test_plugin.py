"""The torchrun.handlers entry point: installing the package is all it takes (in the style of
torch's out-of-tree rendezvous test)."""

from __future__ import annotations

import gc
import importlib.metadata
import subprocess
import sys
import textwrap

from torch.distributed.elastic.rendezvous import RendezvousParameters, rendezvous_handler_registry
from torch.distributed.elastic.rendezvous.registry import get_rendezvous_handler

from tests.helpers import random_port, unique_job
from torch_mingle import _plugin
from torch_mingle.handler import MingleRendezvousHandler


def test_entry_point_is_declared():
    (ep,) = [ep for ep in importlib.metadata.entry_points(group="torchrun.handlers") if ep.name == "mingle"]
    assert ep.value == "torch_mingle._plugin:mingle"
    assert ep.load()() is _plugin.create_handler


def test_torch_registry_creates_a_working_mingle_handler():
    assert rendezvous_handler_registry._registry["mingle"] is _plugin.create_handler
    params = RendezvousParameters(
        backend="mingle", endpoint="", run_id=unique_job(), min_nodes=1, max_nodes=1,
        interface="127.0.0.1", port=str(random_port()),
    )  # fmt: skip
    handler = get_rendezvous_handler(params)
    try:
        # What the agent imported before is out of the collector's sight (``create_handler``).
        assert gc.get_freeze_count() > 0
        assert isinstance(handler, MingleRendezvousHandler)
        assert handler.get_backend() == "mingle"
        assert handler.use_agent_store is True
        assert handler.get_run_id() == params.run_id
        info = handler.next_rendezvous()
        assert (info.rank, info.world_size) == (0, 1)
        assert info.bootstrap_store_info is not None
        assert info.bootstrap_store_info.master_addr == "127.0.0.1"
        info.store.set("k", "v")
        assert info.store.get("k") == b"v"
    finally:
        assert handler.shutdown() is True


def test_importing_the_plugin_is_cheap():
    code = textwrap.dedent(
        """
        import sys, threading, socket
        opened = []
        real = socket.socket.__init__
        def spy(self, *a, **k):
            opened.append(a)
            real(self, *a, **k)
        socket.socket.__init__ = spy
        import torch_mingle, torch_mingle._plugin
        creator = torch_mingle._plugin.mingle()
        assert callable(creator)
        assert "torch" not in sys.modules, "importing the plugin imported torch"
        assert threading.active_count() == 1, threading.enumerate()
        assert not opened, opened
        print("cheap")
        """
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "cheap"
