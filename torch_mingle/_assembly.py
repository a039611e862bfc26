"""The composition root: from a ``MingleConfig`` to a node whose loop is ready to start.

It picks the interfaces, claims the node's identity (``_identity``), builds the election core,
the node's settings, the discovery transports, the loop and the board, and tunes the host for
a leader (``_host``). The handler (and through it the standalone API) builds its node here and
keeps only what torch's agent asks of it.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import time
from pathlib import Path

from torch_mingle._board import Board
from torch_mingle._claims import Timing
from torch_mingle._datapath import ProbeListener
from torch_mingle._host import raise_descriptor_limit, warn_if_accept_queue_short
from torch_mingle._identity import Identity, default_state_dir
from torch_mingle._interfaces import Interface, discovery_interfaces, family_of
from torch_mingle._loop import Loop
from torch_mingle._node import Node
from torch_mingle._order import place_of
from torch_mingle._protocol import Discovery
from torch_mingle._record import record
from torch_mingle._settings import Beats, NodeSettings, RoundRules
from torch_mingle._slurm import JOB_ID_ENV
from torch_mingle._store import StoreKeeper
from torch_mingle._transport import McastTransport
from torch_mingle._view import Diagnostics
from torch_mingle._wire import SCOPE_NAMES, Codec, derive_key, parse_ip
from torch_mingle.config import MingleConfig
from torch_mingle.errors import README_SECURITY, MingleConfigError

log = logging.getLogger(__name__)

#: The longest a follower waits for the leader to accept its connection.
MAX_CONNECT_TIMEOUT_S = 5.0

_warned_unauthenticated = False


@record(frozen=False)
class Assembly:
    """A node, its loop (not started) and what the handler needs of how they were built."""

    ifaces: list[Interface]
    #: Several interfaces and no pin: every one listens, stores on the wildcard.
    multi: bool
    #: This node's address (its first interface's, or ``local_addr``).
    ip: str
    #: Where this node's agent connects to the stores it hosts as leader.
    connect_ip: str
    identity: Identity
    label: str
    #: The data path check's port (docs/networks.md), open before the node can join.
    probe: ProbeListener | None
    loop: Loop
    board: Board
    node: Node


def assemble(config: MingleConfig, *, node_id: int | None = None) -> Assembly:
    family = family_of(config.group)
    ifaces, why = discovery_interfaces(config.interface, family, local_addr=config.local_addr)
    # With several interfaces and no pin, every one listens; the node settles on the one its
    # job's peers answer on, and the stores of a leader listen on all of them.
    multi = len(ifaces) > 1
    with contextlib.suppress(OSError):
        SCOPE_NAMES.update(socket.if_nameindex())  # link-local scopes named as every host names them
    ip = _resolve_ip(config.local_addr, family) if config.local_addr else ifaces[0].address
    bind_ip = _wildcard(family) if multi else ip
    connect_ip = _loopback(family) if multi else ip
    # A restarted agent takes over its dead predecessor's node id and vote (``_identity``).
    if node_id is not None or config.state_dir == "none":
        identity = Identity.fresh(node_id)
    else:
        state_dir = Path(config.state_dir) if config.state_dir else default_state_dir()
        identity = Identity.claim(state_dir, config.run_id, f"[{config.run_id}]", keep_s=config.join_timeout)
    label = f"[{config.run_id} {identity.node_id:016x}]"
    log.info(
        "%s mingle rendezvous: %s; interface %s (%s)",
        label,
        config.describe(),
        ", ".join(f"{i.name} {i.address}" for i in ifaces),
        why,
    )
    if config.run_id == os.environ.get(JOB_ID_ENV):
        log.info("%s rdzv_id: Slurm job %s", label, config.run_id)
    for warning in config.warnings():
        log.warning("%s %s", label, warning)
    raise_descriptor_limit(config.max_nodes, label)
    warn_if_accept_queue_short(config.max_nodes, label)
    secret = config.load_secret()
    if secret is None:
        _warn_unauthenticated_once(config)
    core = Discovery(
        config.run_id,
        identity.node_id,
        timing=Timing.for_keep_alive(
            config.election_window, config.keep_alive_interval, config.keep_alive_max_attempt
        ),
        codec=Codec(derive_key(secret) if secret is not None else None),
        addrs=tuple(i.address for i in ifaces) if multi else (ip,),
        wall_offset_s=time.time() - time.monotonic(),
        expected_nodes=config.max_nodes,
    )
    probe = ProbeListener(family) if config.data_path_timeout > 0 else None
    settings = NodeSettings(
        job=config.run_id,
        node_id=identity.node_id,
        rules=RoundRules(
            min_nodes=config.min_nodes,
            max_nodes=config.max_nodes,
            last_call_timeout_s=config.last_call_timeout,
            rejoin_delay_s=config.rejoin_delay,
            quorum=config.quorum == "majority",
            first_round_majority=config.first_round == "majority",
        ),
        beats=Beats(
            interval_s=config.keep_alive_interval,
            timeout_s=config.keep_alive_timeout,
            connect_timeout_s=min(MAX_CONNECT_TIMEOUT_S, config.keep_alive_timeout),
        ),
        discovery_warning_s=config.discovery_warning,
        bind_ip=bind_ip,
        advertised_ip=bind_ip,
        connect_ip=connect_ip,
        label=label,
        probe_port=probe.port if probe is not None else 0,
        incarnation=identity.incarnation,
        place=place_of(config.rank_order, os.environ),
        terms=config.terms(),
    )
    broadcast = config.fallback == "broadcast"
    transports = [
        McastTransport(i, config.group, config.port, config.ttl, broadcast=broadcast) for i in ifaces
    ]
    loop = Loop(
        transports,
        keeper=StoreKeeper(bind_ip, connect_ip),
        peers=config.peer_hosts(),
        standby_peers=config.standby_hosts(),
        write_timeout_s=config.keep_alive_timeout,
        connect_timeout_s=settings.beats.connect_timeout_s,
        label=label,
        membership_refresh_s=config.membership_refresh,
        identity=identity,
    )
    board = Board(Diagnostics(node_id=f"{settings.node_id:016x}", job=settings.job, role="idle"))
    node = Node(settings, core, loop, state=identity.state)
    return Assembly(ifaces, multi, ip, connect_ip, identity, label, probe, loop, board, node)


def _warn_unauthenticated_once(config: MingleConfig) -> None:
    global _warned_unauthenticated  # noqa: PLW0603 - once per process, as promised in docs/security.md
    if _warned_unauthenticated:
        return
    _warned_unauthenticated = True
    log.warning(
        "mingle runs without a secret: anyone who can send to %s port %d can join job %r or pretend to "
        "lead it; set --rdzv_conf secret_file=PATH (or $TORCH_MINGLE_SECRET_FILE) on every node (%s)",
        config.group,
        config.port,
        config.run_id,
        README_SECURITY,
    )


def _wildcard(family: int) -> str:
    return "::" if family == socket.AF_INET6 else "0.0.0.0"  # noqa: S104 - a leader on several networks


def _loopback(family: int) -> str:
    return "::1" if family == socket.AF_INET6 else "127.0.0.1"


def _resolve_ip(addr: str, family: int) -> str:
    with contextlib.suppress(ValueError):
        parse_ip(addr)
        return addr
    try:
        infos = socket.getaddrinfo(addr, None, family, socket.SOCK_STREAM)
    except OSError as exc:
        raise MingleConfigError(f"--local-addr {addr!r} does not resolve to an address: {exc}") from exc
    return str(infos[0][4][0])
