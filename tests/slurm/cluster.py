"""A Slurm cluster on this machine: ``slurmctld`` and one ``slurmd`` per network namespace.

Each node is a namespace of its own (its own address on a bridge with no uplink, and its own
host name: ``unshare --uts``), with a ``slurmd -N nodeN``; the controller has a namespace too.
``munged`` runs on the host with a key and socket of the test's own (the daemons of every
namespace share the file system, so one serves all). Everything lives in a temporary
directory; ``stop()`` kills what it started, by PID, and deletes the namespaces.

Debian's ``slurmctld``, ``slurmd``, ``slurm-client`` and ``munge`` are installed when missing
(as root, from the package registry); where that is not possible the tier is skipped with why.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

from tests.helpers import descendants, wait_until
from tests.netns.segment import NETNS_ETC, Host, Segment, netns_available

PACKAGES = ("slurmctld", "slurmd", "slurm-client", "munge")
NEEDED = ("slurmctld", "slurmd", "sbatch", "scontrol", "munged")
SUBNET = "198.18.3"
START_S = 60.0
#: Slurm's MaxJobId is 67,043,328 by default: a first job id stays well below it.
MAX_FIRST_JOB_ID = 60_000_000


def slurm_available() -> str | None:
    """None if a cluster can run here, else why not (the test is skipped with it)."""
    why = netns_available()
    if why is not None:
        return why
    if all(shutil.which(tool) for tool in NEEDED):
        return None
    if os.geteuid() != 0 or not shutil.which("apt-get"):
        return f"Slurm ({', '.join(PACKAGES)}) is not installed and cannot be installed: root and apt needed"
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "-q", "--no-install-recommends", *PACKAGES]
    done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0:  # a fresh machine may have no package lists yet
        subprocess.run(["apt-get", "update", "-q"], capture_output=True, env=env, timeout=900, check=False)
        done = subprocess.run(install, capture_output=True, text=True, env=env, timeout=900, check=False)
    if done.returncode != 0 or not all(shutil.which(tool) for tool in NEEDED):
        return f"installing {' '.join(PACKAGES)} failed: {done.stdout[-500:]}{done.stderr[-500:]}"
    return None


@dataclass
class Cluster:
    """``nodes`` Slurm nodes named node1..nodeN, each in a namespace; ``run`` runs a client."""

    root: Path
    nodes: int = 3
    segment: Segment = field(default_factory=Segment)
    hosts: list[Host] = field(default_factory=list)
    controller: Host | None = None
    daemons: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)

    @property
    def conf(self) -> Path:
        return self.root / "slurm.conf"

    @property
    def env(self) -> dict[str, str]:
        """What a Slurm command (and the jobs it starts) sees: the cluster's configuration."""
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def node_name(self, host: Host) -> str:
        return f"node{self.hosts.index(host) + 1}"

    def start(self) -> None:
        self.root.mkdir(parents=True, exist_ok=True)
        self.segment.create_bridge()
        self.controller = self.segment.add_host(f"{SUBNET}.10")
        self.hosts = [self.segment.add_host(f"{SUBNET}.{11 + i}") for i in range(self.nodes)]
        names = {"ctl": self.controller, **{self.node_name(h): h for h in self.hosts}}
        self.segment.name_hosts(names)
        self._start_munge()
        self._write_conf()
        self._write_cgroup_conf()
        self._spawn("slurmctld", self.controller, "ctl", f"slurmctld -D -c -i -f {self.conf}")
        for host in self.hosts:
            name = self.node_name(host)
            (self.root / "spool" / name).mkdir(parents=True, exist_ok=True)
            self._spawn(name, host, name, f"slurmd -D -N {name} -f {self.conf}")
        self._wait_idle()

    def _start_munge(self) -> None:
        munge = self.root / "munge"
        munge.mkdir(mode=0o700, exist_ok=True)
        key = munge / "munge.key"
        key.write_bytes(secrets.token_bytes(128))
        key.chmod(0o600)
        self.daemons["munged"] = subprocess.Popen(
            ["munged", "--foreground", "--force", f"--socket={munge / 'munge.sock'}",
             f"--key-file={key}", f"--pid-file={munge / 'munged.pid'}", f"--log-file={munge / 'munged.log'}",
             f"--seed-file={munge / 'munged.seed'}"],
            stdout=subprocess.DEVNULL, stderr=(munge / "munged.out").open("wb"), start_new_session=True,
        )  # fmt: skip
        wait_until((munge / "munge.sock").exists, 20, f"munged's socket; see {munge / 'munged.out'}", 0.2)

    def _write_conf(self) -> None:
        assert self.controller is not None
        r = self.root
        for sub in ("state", "spool", "log"):
            (r / sub).mkdir(exist_ok=True)
        node_lines = "".join(
            f"NodeName={self.node_name(h)} NodeAddr={h.ip} NodeHostname={self.node_name(h)} CPUs=2 "
            "RealMemory=1 State=UNKNOWN\n"
            for h in self.hosts
        )
        self.conf.write_text(
            f"ClusterName=mingle\n"
            # Job ids of their own: a job's id is its rendezvous id, and the nodes' state
            # directories (``state_dir``) outlive a cluster.
            f"FirstJobId={secrets.randbelow(MAX_FIRST_JOB_ID) + 1000}\n"
            f"SlurmctldHost=ctl({self.controller.ip})\n"
            f"SlurmUser=root\nSlurmdUser=root\n"
            f"AuthType=auth/munge\nCredType=cred/munge\nAuthInfo=socket={r / 'munge' / 'munge.sock'}\n"
            f"StateSaveLocation={r / 'state'}\nSlurmdSpoolDir={r / 'spool'}/%n\n"
            f"SlurmctldPidFile={r / 'slurmctld.pid'}\nSlurmdPidFile={r / 'slurmd-%n.pid'}\n"
            f"SlurmctldLogFile={r / 'log' / 'slurmctld.log'}\nSlurmdLogFile={r / 'log' / 'slurmd-%n.log'}\n"
            "ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\nJobAcctGatherType=jobacct_gather/none\n"
            "SelectType=select/linear\nMpiDefault=none\nReturnToService=2\nSlurmdParameters=config_overrides\n"
            "SchedulerType=sched/builtin\nSlurmdTimeout=30\nInactiveLimit=0\nKillWait=5\nWaitTime=0\n"
            "PlugStackConfig=/dev/null\nMailProg=/bin/true\n"
            + node_lines
            + "PartitionName=test Nodes=ALL Default=YES MaxTime=INFINITE State=UP\n"
        )  # fmt: skip

    def _write_cgroup_conf(self) -> None:
        (self.root / "cgroup.conf").write_text("CgroupPlugin=cgroup/v1\nCgroupAutomount=no\n")

    def _spawn(self, name: str, host: Host, hostname: str, command: str) -> None:
        """A daemon in ``host``'s network, under a host name of its own (``unshare --uts``), with
        that namespace's ``/etc/hosts``. ``nsenter``, not ``ip netns exec``: the latter mounts a
        new ``/sys``, which hides the cgroup file system slurmd needs."""
        out = (self.root / "log" / f"{name}.out").open("wb")
        hosts = NETNS_ETC / host.name / "hosts"
        script = f"mount --bind {hosts} /etc/hosts && hostname {hostname} && exec {command}"
        self.daemons[name] = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{host.name}", "unshare", "--uts", "--mount", "sh", "-c", script],
            stdout=out, stderr=subprocess.STDOUT, env=self.env, start_new_session=True,
        )  # fmt: skip
        out.close()

    def _wait_idle(self) -> None:
        def idle() -> bool:
            done = self.run("sinfo", "-h", "-o", "%T %D", check=False)
            states = done.stdout.split()
            return done.returncode == 0 and states[:1] == ["idle"] and states[1:2] == [str(self.nodes)]

        wait_until(idle, START_S, f"{self.nodes} idle Slurm nodes; see {self.root / 'log'}", 0.2)

    def run(
        self, *cmd: str, check: bool = True, timeout: float = 60, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        """A Slurm client command, run on the controller's network (``env``: more variables;
        sbatch passes its environment on to the job)."""
        assert self.controller is not None
        return subprocess.run(
            ["ip", "netns", "exec", self.controller.name, *cmd], capture_output=True, text=True,
            env={**self.env, **(env or {})}, timeout=timeout, check=check,
        )  # fmt: skip

    def processes_on(self, host: Host) -> list[int]:
        """Every process in ``host``'s network namespace: its slurmd and what that started (a
        job's slurmstepd is re-parented to init, so it is no descendant of our slurmd)."""
        try:
            ns = os.stat(f"/run/netns/{host.name}").st_ino
        except OSError:
            return []
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                with contextlib.suppress(OSError):
                    if os.stat(f"/proc/{entry}/ns/net").st_ino == ns:
                        found.append(int(entry))
        return found

    def stop(self) -> None:
        """Kill every process started here, by PID: the daemons, what they started, and every
        process in the cluster's namespaces (the jobs)."""
        hosts = [h for h in (self.controller, *self.hosts) if h is not None]
        pids = [p for h in hosts for p in self.processes_on(h)]
        for proc in self.daemons.values():
            pids += [proc.pid, *descendants(proc.pid)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        for proc in self.daemons.values():
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=10)
        self.segment.destroy()

    def logs(self) -> str:
        """The daemons' logs, for a failure's message."""
        parts = []
        for path in sorted((self.root / "log").glob("*")):
            text = path.read_text(errors="replace")
            parts.append(f"--- {path.name}\n{text[-3000:]}")
        return "\n".join(parts)
