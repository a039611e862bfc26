"""The backend's configuration: one frozen dataclass built from torch's ``RendezvousParameters``.

Every ``--rdzv_conf`` key is a field of the same name. Values arrive as strings from torchrun
and as Python values from scripts; both are parsed and validated here, and a bad value raises
``MingleConfigError`` showing the value and how to fix it.
"""

from __future__ import annotations

import difflib
import ipaddress
import logging
import math
import os
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from torch_mingle._order import DEFAULT_POLICY, parse_policy
from torch_mingle._record import field, record
from torch_mingle._settings import Terms
from torch_mingle._slurm import TORCHRUN_DEFAULT_ID, standby_hosts
from torch_mingle._slurm import run_id as slurm_run_id
from torch_mingle.errors import README_SECURITY, MingleConfigError

if TYPE_CHECKING:
    from torch.distributed.elastic.rendezvous import RendezvousParameters

log = logging.getLogger(__name__)

DEFAULT_GROUP_V4 = "239.255.77.77"
SECRET_FILE_ENV = "TORCH_MINGLE_SECRET_FILE"  # noqa: S105 - the name of a variable, not a secret
SECRET_ENV = "TORCH_MINGLE_SECRET"  # noqa: S105
PEERS_ENV = "TORCH_MINGLE_PEERS"
FALLBACKS = ("broadcast",)
MIN_SECRET_BYTES = 16
DEFAULT_PORT = 29477
MAX_RUN_ID_BYTES = 200


#: Heartbeats a second that the leader receives (and as many it sends) at most with the default
#: interval: about 17 % of one core here (17-18 us per heartbeat in or out, see
#: docs/benchmarks.md#leader-capacity).
LEADER_BEATS_PER_S = 5000


def default_keep_alive_interval(max_nodes: int) -> float:
    """The heartbeat interval when none is set: 0.2 s up to 1,000 nodes, then ``max_nodes /
    LEADER_BEATS_PER_S`` (0.82 s at 4,096, 3.3 s at 16,384), so that the leader's heartbeats stay
    within ``LEADER_BEATS_PER_S`` and a busy leader (a first round of thousands of members takes
    it seconds) is not taken for a dead one. Every node of a job is started with the same
    ``--nnodes``, so every node computes the same interval and timeout."""
    return max(MingleConfig.keep_alive_interval, max_nodes / LEADER_BEATS_PER_S)


@record
class MingleConfig:
    """Settings of one ``mingle`` rendezvous; see the README's table for each key."""

    run_id: str
    min_nodes: int = 1
    max_nodes: int = 1
    #: Interface name (``eth0``) or one of its addresses; ``None`` picks one and logs why.
    interface: str | None = None
    #: Multicast group shared by every node of the job (IPv4 239.x or IPv6 ff0x::).
    group: str = DEFAULT_GROUP_V4
    port: int = DEFAULT_PORT
    #: Multicast TTL / hop limit. 1 keeps discovery on the local segment.
    ttl: int = 1
    join_timeout: float = 600.0
    last_call_timeout: float = 30.0
    close_timeout: float = 30.0
    #: Seconds between heartbeats on each control connection, both ways. A node (the leader
    #: included) that is silent for ``keep_alive_interval x keep_alive_max_attempt`` (1.4 s) is
    #: gone: that bound is the detection time, and a stall of the agent shorter than the bound
    #: less one interval (1.2 s) goes unnoticed (docs/faults.md#detection-and-the-knobs). Unset,
    #: it grows with ``max_nodes`` past 1,000 nodes (``default_keep_alive_interval``).
    keep_alive_interval: float = 0.2
    keep_alive_max_attempt: int = 7
    #: How long a starting node listens for an existing leader before it may claim leadership.
    election_window: float = 0.02
    #: Injected by torchrun (``--rdzv_timeout``, default 900). Accepted and not used: see README.
    timeout: float | None = None
    #: A file holding the job's shared secret: datagrams are then signed and checked (HMAC-SHA256).
    secret_file: str | None = None
    #: ``broadcast``: also send discovery datagrams to the interface's subnet broadcast address.
    fallback: str | None = None
    #: Hosts to reach by unicast as well (names or addresses, separated by ``;`` or spaces).
    peers: str | None = None
    #: Seconds after which a node that heard no other node of its job says so in the log.
    discovery_warning: float = 10.0
    #: Seconds a healthy round runs before a node that was dropped from the job (frozen, cut off)
    #: may restart it to come back; doubled each time the same node is dropped again.
    rejoin_delay: float = 30.0
    #: Seconds between fresh IGMP/MLD membership reports for the discovery group (a switch that
    #: snoops IGMP without a querier stops forwarding a group some 260 s after the last report).
    membership_refresh: float = 60.0
    #: ``majority``: a round after the first needs a majority of the previous round's members
    #: (one job per rdzv_id even when the network splits); ``none``: any ``min_nodes`` go on.
    quorum: str = "majority"
    #: ``min_nodes``: a job's first round forms with ``min_nodes`` (torchrun's meaning of
    #: ``--nnodes``); ``majority``: with more than half of ``max_nodes``, so that two sides of a
    #: network split at start-up, each with ``min_nodes``, never start two jobs.
    first_round: str = "min_nodes"
    #: Seconds each node gives its TCP probes of the round's peers before the workers start
    #: (``_datapath``); 0 turns the check off.
    data_path_timeout: float = 5.0
    #: torchrun's ``--local-addr``: this node's address to advertise (an IP or a resolvable name).
    local_addr: str | None = None
    #: Where a node keeps its identity and its vote across restarts of its agent (``_identity``);
    #: ``none`` keeps nothing (a restarted agent is a new node). Default: see ``default_state_dir``.
    state_dir: str | None = None
    #: How ranks follow the hardware (``_order``): ``host``, ``arrival``, ``env:VAR`` or
    #: ``topology``; rank 0 is always the leader, whose node hosts the store.
    rank_order: str = DEFAULT_POLICY
    #: A command run (``/bin/sh -c``) before each join; a non-zero exit keeps the node out of
    #: the round until it passes (``_health``).
    health_check: str | None = None
    #: Seconds one run of ``health_check`` may take before it is killed and counts as failed.
    health_check_timeout: float = 60.0
    #: ``--rdzv_endpoint``: accepted and not used (some launchers pass one anyway); logged once.
    endpoint: str = ""
    #: Keys the user set explicitly, for logging.
    explicit: frozenset[str] = field(default=frozenset(), compare=False)

    @property
    def keep_alive_timeout(self) -> float:
        """Seconds without a heartbeat after which a node (or the leader) counts as dead."""
        return self.keep_alive_interval * self.keep_alive_max_attempt

    @property
    def family_name(self) -> str:
        return "IPv6" if ipaddress.ip_address(self.group).version == 6 else "IPv4"

    @classmethod
    def from_params(cls, params: RendezvousParameters) -> MingleConfig:
        """Build and validate the config from what torchrun (or a script) passed.

        Every key may also come from ``$TORCH_MINGLE_<KEY>`` (for launchers that cannot pass
        ``--rdzv_conf``); ``--rdzv_conf`` wins.
        """
        warn_unknown_env(os.environ)
        try:
            return cls.from_mapping(
                run_id=slurm_run_id(params.run_id, os.environ),
                min_nodes=params.min_nodes,
                max_nodes=params.max_nodes,
                local_addr=params.local_addr,
                endpoint=params.endpoint,
                conf={**conf_from_env(os.environ, params.config), **params.config},
            )
        except MingleConfigError as exc:
            raise _keeping_other_keys(exc, params.config) from None

    @classmethod
    def from_mapping(
        cls,
        *,
        run_id: str,
        min_nodes: int,
        max_nodes: int,
        conf: Mapping[str, Any],
        local_addr: str | None = None,
        endpoint: str | None = None,
    ) -> MingleConfig:
        _check_unknown_keys(conf)
        values: dict[str, Any] = {}
        for key, raw in conf.items():
            if raw is None:
                continue
            values[key] = _PARSERS[key](key, raw)
        explicit = frozenset(values)
        if "keep_alive_interval" not in values:
            values["keep_alive_interval"] = default_keep_alive_interval(max_nodes)
        cfg = cls(
            run_id=_check_run_id(run_id),
            min_nodes=min_nodes,
            max_nodes=max_nodes,
            local_addr=local_addr or None,
            endpoint=endpoint or "",
            explicit=explicit,
            **values,
        )
        cfg.validate()
        return cfg

    def validate(self) -> None:
        """Check the cross-field rules; single values were checked while parsing."""
        if self.min_nodes < 1 or self.max_nodes < self.min_nodes:
            raise MingleConfigError(
                f"nnodes {self.min_nodes}:{self.max_nodes} is invalid: need 1 <= min_nodes <= max_nodes, "
                "e.g. --nnodes=2:4"
            )
        _check_group(self.group)
        if self.fallback is not None and self.fallback not in FALLBACKS:
            raise MingleConfigError(
                f"rdzv_conf fallback={self.fallback!r} is not known; the fallback is fallback=broadcast, or "
                "peers=HOST;HOST for unicast (see docs/networks.md#when-multicast-is-blocked)"
            )
        if self.fallback == "broadcast" and ipaddress.ip_address(self.group.split("%", 1)[0]).version == 6:
            raise MingleConfigError(
                f"rdzv_conf fallback=broadcast needs IPv4, but group={self.group} is IPv6 (IPv6 has no "
                "broadcast); use peers=HOST;HOST instead"
            )

    def warnings(self) -> list[str]:
        """Settings that are valid but probably not what the user meant."""
        out = []
        if self.min_nodes < self.max_nodes and self.last_call_timeout >= self.join_timeout:
            out.append(
                f"last_call_timeout={self.last_call_timeout:g}s is not shorter than join_timeout="
                f"{self.join_timeout:g}s: with fewer than max_nodes={self.max_nodes} nodes the first round "
                "times out before its last call ends; lower last_call_timeout"
            )
        if self.ttl > 1:
            out.append(f"ttl={self.ttl}: discovery datagrams may cross routers beyond this segment")
        return out

    def peer_hosts(self, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """``peers`` split into hosts; else $TORCH_MINGLE_PEERS (where commas also separate)."""
        env = os.environ if environ is None else environ
        raw = self.peers if self.peers is not None else env.get(PEERS_ENV, "").replace(",", " ")
        return tuple(h for h in raw.replace(";", " ").split() if h)

    def standby_hosts(self, environ: Mapping[str, str] | None = None) -> tuple[str, ...]:
        """Hosts to try by unicast once multicast stays silent: the Slurm step's node list, unless
        ``peers`` (or $TORCH_MINGLE_PEERS) names the peers already."""
        env = os.environ if environ is None else environ
        return () if self.peer_hosts(env) else standby_hosts(env)

    def load_secret(self, environ: Mapping[str, str] | None = None) -> bytes | None:
        """The shared secret: ``secret_file``, else $TORCH_MINGLE_SECRET_FILE, else $TORCH_MINGLE_SECRET."""
        env = os.environ if environ is None else environ
        path = self.secret_file or env.get(SECRET_FILE_ENV)
        where = "rdzv_conf secret_file" if self.secret_file else f"${SECRET_FILE_ENV}"
        if path:
            try:
                secret = Path(path).read_bytes().strip()
                mode = Path(path).stat().st_mode
            except OSError as exc:
                raise MingleConfigError(
                    f"{where}={path!r} cannot be read: {exc.strerror or exc}; give every node a readable "
                    f"file with the same secret (see {README_SECURITY})"
                ) from None
            if mode & 0o077:
                log.warning(
                    "%s=%s is readable by other users (mode %o); chmod 600 it", where, path, mode & 0o777
                )
        elif env.get(SECRET_ENV):
            where, secret = f"${SECRET_ENV}", env[SECRET_ENV].strip().encode()
        else:
            return None
        if len(secret) < MIN_SECRET_BYTES:
            raise MingleConfigError(
                f"the secret from {where} is {len(secret)} bytes long; use at least {MIN_SECRET_BYTES}, "
                "e.g. `openssl rand -hex 32 > secret`"
            )
        return secret

    def terms(self) -> Terms:
        """What every node of the job must share (docs/usage.md#settings-every-node-must-share):
        a node whose terms differ from its leader's is refused at its hello and fails at once."""
        return (
            ("nnodes", f"{self.min_nodes}:{self.max_nodes}"),
            ("quorum", self.quorum),
            ("first_round", self.first_round),
            ("rank_order", self.rank_order),
            ("keep_alive", f"{self.keep_alive_interval:g}s x{self.keep_alive_max_attempt}"),
        )

    def describe(self) -> str:
        """One line with the settings that matter when reading a log."""
        iface = self.interface or "auto"
        return (
            f"run_id={self.run_id} nnodes={self.min_nodes}:{self.max_nodes} interface={iface} "
            f"group={self.group} port={self.port} ttl={self.ttl} join_timeout={self.join_timeout:g}s "
            f"last_call_timeout={self.last_call_timeout:g}s "
            f"keep_alive={self.keep_alive_interval:g}s x{self.keep_alive_max_attempt}"
        )


def _fix(key: str, example: str) -> str:
    return f"fix: --rdzv_conf {key}={example}"


#: Keys torch's launcher puts into ``--rdzv_conf`` itself (``timeout``: ``--rdzv_timeout``).
_INJECTED = frozenset({"timeout"})


def _keeping_other_keys(exc: MingleConfigError, given: Mapping[str, Any]) -> MingleConfigError:
    """``exc`` with its fix written as the whole ``--rdzv_conf``: the user's other keys kept."""
    if exc.fix is None or exc.fix[0] not in given:
        return exc
    key, example = exc.fix
    kept = [f"{k}={example if k == key else v}" for k, v in given.items() if k == key or k not in _INJECTED]
    if len(kept) < 2:
        return exc
    text = str(exc)
    fix = _fix(key, example)
    head = text[: -len(fix)] if text.endswith(fix) else f"{text}; "
    return MingleConfigError(f"{head}fix: --rdzv_conf {','.join(kept)}", fix=exc.fix)


def _parse_float(key: str, raw: Any, *, minimum: float, maximum: float, example: str) -> float:
    try:
        value = float(raw)
    except (TypeError, ValueError, OverflowError):
        raise MingleConfigError(
            f"rdzv_conf {key}={raw!r} is not a number of seconds; {_fix(key, example)}", fix=(key, example)
        ) from None
    if math.isnan(value) or not minimum <= value <= maximum:
        raise MingleConfigError(
            f"rdzv_conf {key}={raw!r} is out of range: it must be between {_num(minimum)} and "
            f"{_num(maximum)} seconds; {_fix(key, example)}",
            fix=(key, example),
        )
    return value


def _parse_rejoin_delay(key: str, raw: Any) -> float:
    """Seconds, or ``never``: a node dropped from a round never restarts a healthy one to come
    back; it waits as a spare and takes its place when the round restarts anyway."""
    if isinstance(raw, str) and raw.strip().lower() == "never":
        return math.inf
    return _parse_float(key, raw, minimum=0.0, maximum=DAY_S, example="30 (or never)")


def _num(value: float) -> str:
    return str(int(value)) if value == int(value) else f"{value:g}"


def _parse_int(key: str, raw: Any, *, low: int, high: int, example: str) -> int:
    if isinstance(raw, bool):
        raise MingleConfigError(
            f"rdzv_conf {key}={raw!r} is not an integer; {_fix(key, example)}", fix=(key, example)
        )
    try:
        value = int(str(raw).strip(), 10) if not isinstance(raw, int) else raw
    except ValueError:
        raise MingleConfigError(
            f"rdzv_conf {key}={raw!r} is not an integer; {_fix(key, example)}", fix=(key, example)
        ) from None
    if not low <= value <= high:
        raise MingleConfigError(
            f"rdzv_conf {key}={raw!r} is out of range {low}..{high}; {_fix(key, example)}", fix=(key, example)
        )
    return value


def _parse_str(key: str, raw: Any) -> str:
    value = str(raw).strip()
    if not value:
        raise MingleConfigError(f"rdzv_conf {key} is empty; leave it out to use the default")
    return value


def _check_group(group: str) -> None:
    try:
        addr = ipaddress.ip_address(group.split("%", 1)[0])
    except ValueError:
        raise MingleConfigError(
            f"rdzv_conf group={group!r} is not an IP address; {_fix('group', DEFAULT_GROUP_V4)} "
            "(IPv4 239.0.0.0/8) or group=ff12::7777 (IPv6)"
        ) from None
    if not addr.is_multicast:
        raise MingleConfigError(
            f"rdzv_conf group={group!r} is not a multicast address; use one in 239.0.0.0/8 "
            f"(administratively scoped IPv4), e.g. {_fix('group', DEFAULT_GROUP_V4)}"
        )


def _check_run_id(run_id: str) -> str:
    if not run_id:
        raise MingleConfigError("the rendezvous id is empty; fix: torchrun --rdzv_id=<job name>")
    if run_id == TORCHRUN_DEFAULT_ID:
        # Refused, not warned: every job on the network started without an id would be this
        # one job, and a second one would wait as the first's spare, its script never run.
        raise MingleConfigError(
            f"no --rdzv_id was given (torchrun's default is {TORCHRUN_DEFAULT_ID!r}): the mingle "
            "backend finds a job's nodes by its id, so unrelated jobs without one would join each "
            "other. Fix: pass the same --rdzv_id=<job name> to every node of the job (PET_RDZV_ID=... "
            "for launchers without the flag); under Slurm the job's id stands in by itself"
        )
    if len(run_id.encode("utf-8")) > MAX_RUN_ID_BYTES:
        raise MingleConfigError(
            f"--rdzv_id {run_id[:40]!r}... is {len(run_id.encode())} bytes long; "
            f"the mingle backend carries it in every datagram and allows at most {MAX_RUN_ID_BYTES}"
        )
    return run_id


QUORUM_CHOICES = ("majority", "none")
FIRST_ROUND_CHOICES = ("min_nodes", "majority")


def _parse_choice(key: str, value: Any, choices: tuple[str, ...]) -> str:
    text = str(value).strip().lower()
    if text not in choices:
        raise MingleConfigError(
            f"rdzv_conf {key}={value!r} is not one of {', '.join(choices)}, "
            f"e.g. --rdzv_conf {key}={choices[0]}"
        )
    return text


YEAR_S = 365 * 24 * 3600.0
DAY_S = 24 * 3600.0

_PARSERS: dict[str, Any] = {
    "interface": _parse_str,
    "group": _parse_str,
    "port": lambda k, v: _parse_int(k, v, low=1, high=65535, example=str(DEFAULT_PORT)),
    "ttl": lambda k, v: _parse_int(k, v, low=1, high=255, example="1"),
    "join_timeout": lambda k, v: _parse_float(k, v, minimum=0.001, maximum=YEAR_S, example="600"),
    "last_call_timeout": lambda k, v: _parse_float(k, v, minimum=0.0, maximum=YEAR_S, example="30"),
    "close_timeout": lambda k, v: _parse_float(k, v, minimum=0.0, maximum=DAY_S, example="30"),
    "keep_alive_interval": lambda k, v: _parse_float(k, v, minimum=0.01, maximum=3600.0, example="0.2"),
    "keep_alive_max_attempt": lambda k, v: _parse_int(k, v, low=1, high=1000, example="7"),
    "election_window": lambda k, v: _parse_float(k, v, minimum=0.001, maximum=60.0, example="0.02"),
    "timeout": lambda k, v: _parse_float(k, v, minimum=0.0, maximum=YEAR_S, example="900"),
    "secret_file": _parse_str,
    "fallback": _parse_str,
    "peers": _parse_str,
    "discovery_warning": lambda k, v: _parse_float(k, v, minimum=0.0, maximum=YEAR_S, example="10"),
    "rejoin_delay": _parse_rejoin_delay,
    "membership_refresh": lambda k, v: _parse_float(k, v, minimum=1.0, maximum=DAY_S, example="60"),
    "quorum": lambda k, v: _parse_choice(k, v, QUORUM_CHOICES),
    "first_round": lambda k, v: _parse_choice(k, v, FIRST_ROUND_CHOICES),
    "data_path_timeout": lambda k, v: _parse_float(k, v, minimum=0.0, maximum=3600.0, example="5"),
    "state_dir": _parse_str,
    "rank_order": parse_policy,
    "health_check": _parse_str,
    "health_check_timeout": lambda k, v: _parse_float(k, v, minimum=0.1, maximum=DAY_S, example="60"),
}

KNOWN_KEYS = tuple(sorted(_PARSERS))
ENV_PREFIX = "TORCH_MINGLE_"


#: Keys whose variables were read (and parsed) in their own way before every key had one.
_OWN_ENV = frozenset({"peers", "secret_file"})


def conf_from_env(environ: Mapping[str, str], given: Mapping[str, Any]) -> dict[str, str]:
    """The keys set as ``$TORCH_MINGLE_<KEY>`` and not in ``given``; a bad value names its variable.

    ``$TORCH_MINGLE_PEERS`` (commas allowed) and ``$TORCH_MINGLE_SECRET_FILE`` keep their own
    reading, in ``peer_hosts()`` and ``load_secret()``.
    """
    out = {}
    for key in sorted(set(KNOWN_KEYS) - _OWN_ENV):
        var = ENV_PREFIX + key.upper()
        raw = environ.get(var, "").strip()
        if not raw or given.get(key) is not None:
            continue
        try:
            _PARSERS[key](key, raw)
        except MingleConfigError as exc:
            raise MingleConfigError(f"${var}={raw!r}: {exc}") from None
        out[key] = raw
    return out


#: Variables read elsewhere than ``conf_from_env`` (logging, failpoints, rank order, the CLI).
OTHER_ENV = frozenset({"LOG", "FAILPOINTS", "TOPOLOGY", "SECRET", "SECRET_FILE", "PEERS"})


def unknown_env(environ: Mapping[str, str]) -> list[str]:
    """``$TORCH_MINGLE_*`` variables that nothing reads (a misspelt key), each with its advice."""
    known = {ENV_PREFIX + k.upper() for k in KNOWN_KEYS} | {ENV_PREFIX + k for k in OTHER_ENV}
    out = []
    for var in sorted(v for v in environ if v.startswith(ENV_PREFIX) and v not in known):
        close = difflib.get_close_matches(var, sorted(known), n=1)
        hint = f"; did you mean ${close[0]}?" if close else f"; known: {', '.join(sorted(known))}"
        out.append(f"${var} is set but no torch_mingle setting has that name, so it is ignored{hint}")
    return out


def warn_unknown_env(environ: Mapping[str, str]) -> None:
    for said in unknown_env(environ):
        log.warning("%s", said)


def _check_unknown_keys(conf: Mapping[str, Any]) -> None:
    for key in conf:
        if key not in _PARSERS:
            close = difflib.get_close_matches(key, KNOWN_KEYS, n=1)
            hint = f" Did you mean {close[0]!r}?" if close else ""
            raise MingleConfigError(
                f"unknown --rdzv_conf key {key!r} for the mingle backend.{hint} "
                f"Known keys: {', '.join(KNOWN_KEYS)}"
            )
