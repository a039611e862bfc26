"""Stress: kill the leader mid-training, N times, and time the recovery (not part of CI).

Each trial starts 3 torchrun agents (one per network namespace when run as root, else on
127.0.0.1), waits until they train, SIGKILLs the leader's agent and workers, and measures
the time from the kill to the first training step of the new round.

    .venv/bin/python -m tests.stress.leader_kill --trials 20
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from tests.helpers import (
    Agent,
    assert_trained_together,
    final_reports,
    finish_all,
    leader_of,
    random_port,
    resume_delay,
    start_agent,
    torchrun_cmd,
    unique_job,
    wait_until,
)
from tests.netns.segment import Segment, netns_available

STEPS = 30


def trial(index: int, workdir: Path, use_netns: bool) -> dict[str, object]:
    segment = Segment() if use_netns else None
    agents: list[Agent] = []
    try:
        conf: dict[str, object] = {"join_timeout": 120, "last_call_timeout": 1}
        if segment is not None:
            segment.create_bridge()
            for i in range(3):
                segment.add_host(f"198.18.0.{11 + i}")
            conf["interface"] = "eth0"
        else:
            conf.update(interface="127.0.0.1", port=random_port())
        cmd = torchrun_cmd(
            job=unique_job("stress"), nnodes="2:3", nproc=1, conf=conf, extra=["--max-restarts=3"],
            script_args=[
                "--steps", str(STEPS), "--step-time", "0.1", "--quiet",
                "--checkpoint", str(workdir / "ckpt"), "--report", str(workdir / "report"),
            ],
        )  # fmt: skip
        for i in range(3):
            netns = segment.hosts[i].name if segment is not None else None
            agents.append(start_agent(f"t{index}-node{i}", cmd, workdir, netns=netns))
        ckpt = workdir / "ckpt" / "ckpt.pt"
        wait_until(lambda: any("joined round 1" in a.output() for a in agents), 120, "round 1")
        wait_until(ckpt.exists, 120, "a first checkpoint", interval=0.05)
        leader = leader_of(agents)
        killed = time.time()
        leader.kill()
        codes = finish_all([a for a in agents if a is not leader], timeout=180)
        assert codes == [0, 0], f"the survivors exited with {codes}"
        reports = final_reports(workdir / "report")
        assert_trained_together(reports, 2, STEPS)
        recovery = resume_delay(reports, killed)
    except AssertionError as exc:
        return {"trial": index, "ok": False, "recovery_s": None, "error": str(exc)[:300]}
    else:
        return {"trial": index, "ok": True, "recovery_s": recovery, "codes": codes}
    finally:
        for agent in agents:
            agent.kill()
        if segment is not None:
            segment.destroy()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trials", type=int, default=20)
    p.add_argument("--loopback", action="store_true", help="use 127.0.0.1 even where namespaces work")
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args()
    use_netns = not args.loopback and netns_available() is None
    where = "one network namespace per node" if use_netns else "loopback"
    print(f"leader-kill stress: {args.trials} trials, {where}")
    results = []
    for i in range(1, args.trials + 1):
        with tempfile.TemporaryDirectory(prefix="mingle-stress-") as tmp:
            result = trial(i, Path(tmp), use_netns)
        results.append(result)
        rec = result["recovery_s"]
        rec_text = f"{rec:.2f}s" if isinstance(rec, float) else "-"
        status = "ok  " if result["ok"] else "FAIL"
        print(f"trial {i:2d}: {status} kill -> first step of the new round {rec_text}", flush=True)
        if "error" in result:
            print(f"          {result['error']}", flush=True)
    times = [r["recovery_s"] for r in results if r["ok"] and isinstance(r["recovery_s"], float)]
    passed = sum(1 for r in results if r["ok"])
    print(f"\n{passed}/{len(results)} trials completed")
    if times:
        print(
            f"recovery (kill -> first step of the new round): median {statistics.median(times):.2f}s, "
            f"min {min(times):.2f}s, max {max(times):.2f}s"
        )
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
    return 0 if passed == len(results) else 1


if __name__ == "__main__":
    sys.exit(main())
