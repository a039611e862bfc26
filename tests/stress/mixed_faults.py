"""Stress: one fault per trial, of every kind the field produces, at any node (the leader included).

Each trial starts a 3-node job (``--nnodes=2:3``, one torchrun agent per network namespace,
the default heartbeats), waits until it trains, injects one fault and lets the job finish:

* ``kill``    SIGKILL of the node's whole process tree (it is gone for good);
* ``freeze``  SIGSTOP of the whole tree for 5 s, then SIGCONT;
* ``flap``    the node's link down for 5 s, then up;
* ``loss``    20 % of the packets to the node dropped for 10 s (nftables);
* ``partition`` the node's cable moved to a bridge of its own for 5 s, then back (a 2|1
  split: the two keep a quorum and go on, the one waits and re-joins);
* ``mcast-off`` multicast and broadcast flooding turned off on every port once the job
  trains (a snooping switch that forgot the group), then the leader SIGKILLed: the
  members take over by unicast (the leader is always the victim).
* ``reset-partition`` four nodes (``--nnodes=2:4``) split 2|2 for 5 s by a firewall that
  answers every TCP segment across the cut with a reset (nftables ``reject with tcp reset``
  in each namespace; datagrams dropped): neither half holds a majority, so neither trains
  until the split heals. Rank 0 of every round logs each step with its (epoch, round): the
  trial fails if two rounds ever trained at once.
* ``cold-start`` no fault: a job of five nodes (``--nnodes=3:5``) started from nothing, again
  and again, since what goes wrong there goes wrong where a job forms or ends (issue 42). The
  nodes boot within 1 s; in two trials of three, the last two or the last one boot 4 s later:
  the job forms with three or four and grows while the late ones wait. A trial also
  fails if a worker trained in a world other than its round's (each worker's ``WORLD_SIZE``,
  fixed at its ``init_process_group`` and recorded at its first step with ``MINGLE_ROUND``,
  against the world its agent logged for that round, ``GROUP_WORLD_SIZE`` and the other
  workers of the round), if an agent exited non-zero, if a worker failed for any other reason
  than a peer's agent stopping first for a newcomer (torch's agents each poll
  ``num_nodes_waiting()`` on their own, up to a monitor interval apart: those are counted), or
  if the job did not end with all five. A trial takes 13-19 s here.

``--keep-alive 1x3`` and ``--rejoin-delay never`` change those two knobs for every node;
each trial also reports when a survivor noticed the fault (its first "no heartbeat" line, for
the faults that only silence shows), the restarts the fault caused and the training seconds
it cost.

A trial passes when every node that was not killed exits 0 and the last round trained to
the end with identical parameters on every rank. The new round is the time from the fault to
the first survivor's "joined round" (bounded by ``bound_of``: the heartbeat timeout and 2 s,
and the outage of a reset partition); recovery is the time to the first training step of the
round that replaced the broken one (none when the fault broke nothing), stated, not bounded:
it adds the workers' start, which is torch's and the script's. The run exits 1 if a trial
failed or a new round came late. Not part of CI: ``make stress`` runs 20 mixed trials, 20
partitions, 20 multicast-off failovers, 20 reset partitions (about 50 minutes here) and 100
cold starts (about 30 minutes).

    .venv/bin/python -m tests.stress.mixed_faults --trials 20 [--faults partition]
    .venv/bin/python -m tests.stress.mixed_faults --trials 100 --faults cold-start
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import re
import shutil
import signal
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from tests.helpers import (
    Agent,
    assert_trained_together,
    final_reports,
    finish_all,
    joins,
    leader_of,
    logged_at,
    read_reports,
    resume_delay,
    rounds_training_at_once,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from tests.netns.segment import Segment, netns_available, nftables_available
from torch_mingle.config import MingleConfig

FAULTS = ("kill", "freeze", "flap", "loss")
EXTRA_FAULTS = ("partition", "mcast-off", "reset-partition", "cold-start")
STEPS = 150
#: A cold start: five nodes, the fewest that form a round three; steps for about 5 s of training.
COLD_NODES, COLD_MIN_NODES, COLD_STEPS = 5, 3, 40
#: The nodes of a cold start boot within this many seconds, each at a random moment of it, the
#: last ``late_nodes`` of them ``COLD_LATE_S`` later: none late (the job forms with all five),
#: two or one (it forms with three or four and grows as they come: a newcomer waits meanwhile).
COLD_SPREAD_S, COLD_LATE_S = 1.0, 4.0


def late_nodes(index: int) -> int:
    """How many nodes of cold start ``index`` (from 1) boot late: 0, 2, 1, 0, 2, 1, ..."""
    return (0, 2, 1)[(index - 1) % 3]


#: What a worker's failure looks like in its agent's log (torch's agent, before it restarts them).
WORKERS_FAILED = re.compile(r"Worker group (FAILED|UNHEALTHY)")
#: A worker that failed only because a peer's agent stopped its worker for a membership change
#: first (torch's agents each poll ``num_nodes_waiting()`` on their own: their restarts are up
#: to a monitor interval apart, and a worker in a collective sees its peer's end as an error).
#: Counted (``peer_stops``), not failed: it costs a restart, not a wrong world or exit code.
PEER_STOPPED = re.compile(r"Connection (closed|reset) by peer")
#: The lines of an agent's log that say why a worker failed.
SYMPTOM = re.compile(r"terminate called|exitcode|Signal \d+|Traceback|Error|Worker group (FAILED|UNHEALTHY)")
KEEP_ALIVE_S, ATTEMPTS = MingleConfig.keep_alive_interval, MingleConfig.keep_alive_max_attempt
#: What the rendezvous may take beyond the heartbeat timeout (the election, the round's votes).
SLACK_S = 2.0


def bound_of(fault: str, keep_alive: tuple[float, int] = (KEEP_ALIVE_S, ATTEMPTS)) -> float:
    """The bound on the new round after ``fault`` (what mingle controls): the heartbeat timeout
    and the rendezvous; a split that no half survives lasts its outage first. The workers'
    start after it (torch, the script, here on two shared cores) is measured, not bounded."""
    bound = keep_alive[0] * keep_alive[1] + SLACK_S
    return bound + (OUTAGE_S if fault == "reset-partition" else 0.0)


OUTAGE_S = 5.0
#: How long the fresh round runs before the node that returns may restart it. It must exceed
#: what the fresh round's workers take to reach their first step, or the returning node undoes
#: a round that never trained: 5 s did on a 2-core machine whose two new workers needed 4.5 to
#: 5 s (Python, torch, DDP's torch._dynamo), and training came back only after 14 s.
REJOIN_DELAY_S = 10.0


def cold_start(index: int, workdir: Path, rng: random.Random) -> dict[str, Any]:
    """A job of five nodes from nothing (some of them late), no fault: it forms, trains and ends cleanly."""
    segment = Segment()
    agents: list[Agent] = []
    trace, report = workdir / "steps.log", workdir / "report"
    result: dict[str, Any] = {"trial": index, "fault": "cold-start", "at": "-"}
    started = time.time()
    try:
        segment.create_bridge("br0")
        hosts = [segment.add_host(f"198.18.0.{11 + i}") for i in range(COLD_NODES)]
        conf = {"interface": "eth0", "join_timeout": 120, "last_call_timeout": 1,
                "rejoin_delay": REJOIN_DELAY_S}  # fmt: skip
        cmd = torchrun_cmd(
            job=unique_job("cold"), nnodes=f"{COLD_MIN_NODES}:{COLD_NODES}", nproc=1, conf=conf,
            extra=["--max-restarts=5"],
            script_args=["--steps", str(COLD_STEPS), "--step-time", "0.1", "--quiet", "--trace", str(trace),
                         "--checkpoint", str(workdir / "ckpt"), "--report", str(report)],
        )  # fmt: skip
        late = late_nodes(index)
        delays = sorted(rng.uniform(0.0, COLD_SPREAD_S) for _ in hosts)
        delays = delays[: len(hosts) - late] + [d + COLD_LATE_S for d in delays[len(hosts) - late :]]
        result["late"] = late
        started = time.time()
        for host, delay in zip(hosts, delays, strict=True):
            time.sleep(max(0.0, started + delay - time.time()))
            agents.append(start_agent(f"t{index}-{host.name}", cmd, workdir, netns=host.name))
        codes = finish_all(agents, timeout=240)
        result["codes"] = codes
        result["duration_s"] = time.time() - started
        assert codes == [0] * len(agents), f"exit codes {codes}: {symptoms(agents)}"
        wrong = worlds_not_their_rounds(report, agents)
        assert wrong is None, wrong
        failed = [a for a in agents if WORKERS_FAILED.search(a.output())]
        odd = [a for a in failed if not PEER_STOPPED.search(a.output())]
        assert not odd, f"workers failed on {[a.name for a in odd]}: {symptoms(odd)}"
        result["peer_stops"] = len(failed)
        reports = final_reports(report)
        world = {r["world_size"] for r in reports}
        assert world == {COLD_NODES}, f"the last round's world is {world}, not all {COLD_NODES} nodes"
        assert_trained_together(reports, COLD_NODES, COLD_STEPS)
        result["world"] = COLD_NODES
        overlap = rounds_training_at_once(trace)
        assert overlap is None, f"two rounds trained at once: {overlap}"
        lines = trace.read_text().splitlines() if trace.exists() else []
        result["rounds"] = len({tuple(line.split()[1:3]) for line in lines})
        result["formed"] = len({rnd for a in agents for rnd, _, _ in joins(a)})
        joined = [logged_at(a, "joined round") for a in agents]
        result["formed_s"] = min((j - started for j in joined if j is not None), default=None)
        result["trained_s"] = float(lines[0].split()[0]) - started if lines else None
        result["ok"] = True
    except AssertionError as exc:
        result.update(ok=False, error=str(exc)[:1200])
    finally:
        for agent in agents:
            agent.kill()
        segment.destroy()
    return result


def symptoms(agents: Sequence[Agent], most: int = 6) -> str:
    """The lines of the agents' logs that say why their workers failed, the first ``most`` of each."""
    found = []
    for agent in agents:
        lines = [line.strip()[:160] for line in agent.output().splitlines() if SYMPTOM.search(line)]
        found.append(f"[{agent.name}] " + " | ".join(lines[:most]))
    return "; ".join(found)


def worlds_not_their_rounds(report_dir: Path, agents: Sequence[Agent]) -> str | None:
    """A worker that trained in a world other than its round's, if any.

    A worker's world is fixed by its ``init_process_group``: its first step's record (with the
    round's variables) speaks for every step it trained, and its final report for the end. The
    round's world is what every agent of the round logged on joining it ("joined round R as rank
    G of N"); the records of one round must agree with it, with ``GROUP_WORLD_SIZE`` (one worker
    per node), and with each other (distinct ranks below the world).
    """
    told: dict[int, set[int]] = {}
    for agent in agents:
        for rnd, _, size in joins(agent):
            told.setdefault(rnd, set()).add(size)
    split = {rnd: sizes for rnd, sizes in told.items() if len(sizes) > 1}
    if split:
        return f"agents were told different worlds for one round: {split}"
    firsts = [json.loads(p.read_text()) for p in sorted(report_dir.glob("first-*.json"))]
    taken: dict[tuple[str, str], list[int]] = {}
    for record in firsts + read_reports(report_dir):
        env, world = record.get("env", {}), record["world_size"]
        rnd = env.get("MINGLE_ROUND", "")
        where = f"rank {record['rank']} (round {rnd}, GROUP_RANK {env.get('GROUP_RANK')})"
        if not rnd.isdigit() or int(rnd) not in told:
            return f"{where} trained in a world of {world} in a round no agent joined"
        if world not in told[int(rnd)] or str(world) != env.get("GROUP_WORLD_SIZE"):
            return (
                f"{where} trained in a world of {world}; its round's world is {told[int(rnd)]}, "
                f"GROUP_WORLD_SIZE={env.get('GROUP_WORLD_SIZE')}"
            )
        if not 0 <= record["rank"] < world:
            return f"{where} is outside its world of {world}"
        if "params" not in record:  # one first record per worker; each round starts its own workers
            taken.setdefault((env.get("MINGLE_EPOCH", ""), rnd), []).append(record["rank"])
    twice = {key: sorted(ranks) for key, ranks in taken.items() if len(set(ranks)) < len(ranks)}
    if twice:
        return f"two workers of one round took the same rank: {twice}"
    return None


def trial(
    index: int,
    fault: str,
    at_leader: bool,
    workdir: Path,
    rng: random.Random,
    rejoin_delay: str = "",
    keep_alive: tuple[float, int] = (KEEP_ALIVE_S, ATTEMPTS),
) -> dict[str, Any]:
    segment = Segment()
    agents: list[Agent] = []
    trace = workdir / "steps.log"
    result: dict[str, Any] = {"trial": index, "fault": fault, "at": "leader" if at_leader else "follower"}
    try:
        segment.create_bridge("br0" if fault != "mcast-off" else "brq", mcast_snooping=fault != "mcast-off")
        bridge = segment.bridges[-1]
        nodes = 4 if fault == "reset-partition" else 3
        hosts = [segment.add_host(f"198.18.0.{11 + i}", bridge=bridge) for i in range(nodes)]
        conf = {"interface": "eth0", "join_timeout": 120, "last_call_timeout": 1,
                "rejoin_delay": rejoin_delay or REJOIN_DELAY_S, "keep_alive_interval": keep_alive[0],
                "keep_alive_max_attempt": keep_alive[1]}  # fmt: skip
        cmd = torchrun_cmd(
            job=unique_job("stress"), nnodes=f"2:{nodes}", nproc=1, conf=conf, extra=["--max-restarts=5"],
            script_args=["--steps", str(STEPS), "--step-time", "0.1", "--quiet", "--trace", str(trace),
                         "--checkpoint", str(workdir / "ckpt"), "--report", str(workdir / "report")],
        )  # fmt: skip
        agents = [start_agent(f"t{index}-{h.name}", cmd, workdir, netns=h.name) for h in hosts]
        wait_until((workdir / "ckpt" / "ckpt.pt").exists, 120, "the job to train", 0.05, agents)
        time.sleep(rng.uniform(0.0, 2.0))  # the fault lands anywhere in a training step
        leader = leader_of(agents)
        victim = leader if at_leader else rng.choice([a for a in agents if a is not leader])
        host = hosts[agents.index(victim)]
        struck = time.time()
        if fault == "kill":
            victim.kill()
        elif fault == "freeze":
            victim.kill(signal.SIGSTOP)
            try:
                time.sleep(OUTAGE_S)  # the outage itself
            finally:
                victim.kill(signal.SIGCONT)
        elif fault == "partition":
            segment.split([host])
            try:
                time.sleep(OUTAGE_S)
            finally:
                segment.heal([host], bridge)
        elif fault == "reset-partition":
            others = [h for a, h in zip(agents, hosts, strict=True) if a is not victim]
            rng.shuffle(others)
            segment.reset_split([[host, others[0]], others[1:]])
            try:
                time.sleep(OUTAGE_S)
            finally:
                segment.heal_resets()
        elif fault == "mcast-off":
            segment.drop_multicast(broadcast=True)
            victim.kill()
        elif fault == "flap":
            segment.link(host, up=False)
            try:
                time.sleep(OUTAGE_S)
            finally:
                segment.link(host, up=True)
        else:
            segment.loss(host, 20)
            try:
                time.sleep(2 * OUTAGE_S)
            finally:
                segment.no_loss(host)
        running = [a for a in agents if not (fault in ("kill", "mcast-off") and a is victim)]
        codes = finish_all(running, timeout=240)
        result["codes"] = codes
        assert codes == [0] * len(running), f"exit codes {codes}"
        reports = final_reports(workdir / "report")
        world = {r["world_size"] for r in reports}
        assert len(world) == 1, f"mixed world sizes in the last round: {world}"
        assert_trained_together(reports, world.pop(), STEPS)
        result["world"] = reports[0]["world_size"]
        overlap = rounds_training_at_once(trace)
        assert overlap is None, f"two rounds trained at once: {overlap}"
        result["recovery_s"] = resume_delay(workdir / "report", struck)
        result.update(training_lost(trace, struck))
        joined = [logged_at(a, "joined round", after=struck) for a in running]
        result["rendezvous_s"] = min((j - struck for j in joined if j is not None), default=None)
        noticed = [logged_at(a, "no heartbeat", after=struck) for a in running if a is not victim]
        result["detected_s"] = min((n - struck for n in noticed if n is not None), default=None)
        result["ok"] = True
    except AssertionError as exc:
        result.update(ok=False, error=str(exc)[:400])
    finally:
        for agent in agents:
            agent.kill(signal.SIGCONT)
            agent.kill()
        segment.destroy()
    return result


def training_lost(trace: Path, struck: float) -> dict[str, Any]:
    """What the fault cost the training, from rank 0's step log: the rounds that started after
    it (each a restart of every worker), and the seconds lost: the time from the fault to the
    last step, less what the steps left at the fault take at the pace before it."""
    lines = [line.split() for line in trace.read_text().splitlines()] if trace.exists() else []
    steps = [(float(at), (int(epoch), int(rnd)), int(step)) for at, epoch, rnd, step in lines]
    before = [s for s in steps if s[0] <= struck]
    if len(before) < 3 or not any(s[0] > struck for s in steps):
        return {}
    pace = statistics.median(b[0] - a[0] for a, b in itertools.pairwise(before))
    left = max(s[2] for s in steps) - before[-1][2]
    rounds = {key for _, key, _ in before}
    after = {key for at, key, _ in steps if at > struck} - rounds
    return {"restarts": len(after), "lost_s": (steps[-1][0] - struck) - left * pace}


def cold_start_line(result: dict[str, Any]) -> str:
    """One trial of the cold start, on one line (and its error on the next)."""
    first_round, first_step = (
        f"{t:5.2f}s" if isinstance(t, float) else "   - "
        for t in (result.get("formed_s"), result.get("trained_s"))
    )
    took = f"{result['duration_s']:5.1f}s" if "duration_s" in result else "   - "
    line = (
        f"trial {result['trial']:3d}: {'ok  ' if result['ok'] else 'FAIL'} cold-start, "
        f"{result.get('late', 0)} late: first round after "
        f"{first_round}, first step after {first_step}, {result.get('formed', '-')} round(s) formed, "
        f"{result.get('rounds', '-')} trained, final world "
        f"{result.get('world', '-')}, exit codes {result.get('codes', '-')}, {took}"
    )
    return line if result["ok"] else f"{line}\n          {result['error']}"


def cold_start_summary(results: list[dict[str, Any]]) -> str:
    """The cold starts together: how long the first step took and how many rounds the job had."""
    trained = [r["trained_s"] for r in results if isinstance(r.get("trained_s"), float)]
    took = [r["duration_s"] for r in results if isinstance(r.get("duration_s"), float)]
    rounds = [r["formed"] for r in results if "formed" in r]
    stopped = sum(1 for r in results if r.get("peer_stops"))
    if not trained:
        return "  cold-start: no trial trained"
    return (
        f"  cold-start first step after: median {statistics.median(trained):.2f}s, max {max(trained):.2f}s; "
        f"jobs by rounds formed: {dict(sorted((n, rounds.count(n)) for n in set(rounds)))}; "
        f"a trial took median {statistics.median(took):.1f}s, max {max(took):.1f}s; "
        f"{stopped} trial(s) where a worker failed only because a peer stopped first for a newcomer"
    )


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("--faults", default=",".join(FAULTS), help=f"comma-separated, of {FAULTS + EXTRA_FAULTS}")
    p.add_argument(
        "--keep-alive", default=f"{KEEP_ALIVE_S:g}x{ATTEMPTS}", help="INTERVALxATTEMPTS, e.g. 0.25x6"
    )
    p.add_argument(
        "--rejoin-delay",
        default="",
        help=f"rejoin_delay for every node (seconds or never; {REJOIN_DELAY_S:g} if unset)",
    )
    args = p.parse_args()
    faults = tuple(f.strip() for f in args.faults.split(",") if f.strip())
    interval, _, attempts = args.keep_alive.partition("x")
    keep_alive = (float(interval), int(attempts))
    unknown = [f for f in faults if f not in FAULTS + EXTRA_FAULTS]
    if unknown or not faults:
        p.error(f"unknown faults {unknown}; pick from {', '.join(FAULTS + EXTRA_FAULTS)}")
    needs_nft = {"loss", "reset-partition"} & set(faults)
    reason = netns_available() or (nftables_available() if needs_nft else None)
    if reason is not None:
        print(f"stress needs network namespaces and nftables: {reason}")
        return 2
    rng = random.Random(args.seed)
    if faults == ("cold-start",):
        print(f"cold-start stress: {args.trials} trials, {COLD_NODES} nodes (one namespace each, "
              f"--nnodes={COLD_MIN_NODES}:{COLD_NODES}), {COLD_STEPS} steps, no fault")  # fmt: skip
    else:
        print(f"mixed-fault stress: {args.trials} trials, 3 nodes (one namespace each), heartbeats "
              f"{keep_alive[0]:g}s x {keep_alive[1]}; bound on the new round after a single fault "
              f"{bound_of('kill', keep_alive):g}s")  # fmt: skip
    results = []
    for i in range(args.trials):
        fault, at_leader = faults[i % len(faults)], (i // len(faults)) % 2 == 0
        at_leader = at_leader or fault == "mcast-off"
        with tempfile.TemporaryDirectory(prefix="mingle-stress-") as tmp:
            if fault == "cold-start":
                result = cold_start(i + 1, Path(tmp), rng)
            else:
                result = trial(i + 1, fault, at_leader, Path(tmp), rng, args.rejoin_delay, keep_alive)
            if not result["ok"]:  # the agents' logs outlive the trial: they say why
                kept = Path(tempfile.mkdtemp(prefix=f"mingle-stress-failed-{i + 1}-"))
                shutil.copytree(tmp, kept, dirs_exist_ok=True)
                result["error"] += f" (logs: {kept})"
        results.append(result)
        if fault == "cold-start":
            print(cold_start_line(result), flush=True)
            continue
        rec, rdzv, seen = result.get("recovery_s"), result.get("rendezvous_s"), result.get("detected_s")
        rec_text, rdzv_text, seen_text = (
            f"{t:5.2f}s" if isinstance(t, float) else "   - " for t in (rec, rdzv, seen)
        )
        lost_text = f"{result['lost_s']:.1f}s" if isinstance(result.get("lost_s"), float) else "-"
        status, world = "ok  " if result["ok"] else "FAIL", result.get("world", "-")
        print(
            f"trial {i + 1:2d}: {status} {fault:<6} at the {result['at']:<8} noticed after {seen_text}, "
            f"new round after {rdzv_text}, "
            f"training again after {rec_text}, final world {world}, {result.get('restarts', '-')} restarts, "
            f"{lost_text} of training lost",
            flush=True,
        )
        if not result["ok"]:
            print(f"          {result['error']}", flush=True)
    passed = sum(1 for r in results if r["ok"])
    print(f"\n{passed}/{len(results)} trials finished with identical parameters on every rank")
    for fault in faults:
        of_kind = [r for r in results if r["fault"] == fault]
        if fault == "cold-start":
            print(cold_start_summary(of_kind))
            continue
        seen = [r["detected_s"] for r in of_kind if isinstance(r.get("detected_s"), float)]
        if seen:
            print(f"  {fault:<6} noticed after: median {statistics.median(seen):.2f}s, max {max(seen):.2f}s")
        times = [r["recovery_s"] for r in of_kind if isinstance(r.get("recovery_s"), float)]
        if times:
            print(
                f"  {fault:<6} training again after: median {statistics.median(times):.2f}s, "
                f"max {max(times):.2f}s ({len(times)} of {len(of_kind)} trials restarted)"
            )
        lost = [r["lost_s"] for r in of_kind if isinstance(r.get("lost_s"), float)]
        if lost:
            restarts = [r["restarts"] for r in of_kind if "restarts" in r]
            print(
                f"  {fault:<6} training lost: median {statistics.median(lost):.1f}s, max {max(lost):.1f}s; "
                f"restarts per fault: {sorted(restarts)}"
            )
    late = [
        r
        for r in results
        if isinstance(r.get("rendezvous_s"), float) and r["rendezvous_s"] > bound_of(r["fault"], keep_alive)
    ]
    slowest_round = max(
        (r["rendezvous_s"] for r in results if isinstance(r.get("rendezvous_s"), float)), default=None
    )
    if slowest_round is not None:
        bounds = ", ".join(f"{f} {bound_of(f, keep_alive):g}s" for f in faults)
        verdict = "within" if not late else f"OVER in {len(late)} trial(s)"
        print(
            f"slowest new round after a single fault: {slowest_round:.2f}s, {verdict} the bounds ({bounds})"
        )
    worst = max((r["recovery_s"] for r in results if isinstance(r.get("recovery_s"), float)), default=None)
    if worst is not None:
        print(f"slowest recovery (training again, the workers' start included): {worst:.2f}s")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if passed == len(results) and not late else 1


if __name__ == "__main__":
    sys.exit(main())
