"""A small DDP training (nn.Linear, gloo or NCCL) that torchrun starts on every node.

Nothing here knows an address: torchrun's agent sets MASTER_ADDR/MASTER_PORT, RANK and
WORLD_SIZE from the mingle rendezvous, and ``init_process_group`` reads them (env://).

With ``--checkpoint DIR`` rank 0 saves the model after every step and every restarted
round resumes from the last checkpoint, as an elastic job should. Each checkpoint is tagged
with the round that wrote it (``MINGLE_EPOCH``, ``MINGLE_ROUND``, set by mingle's agent), and
a round never overwrites a checkpoint written under a newer epoch: its workers stop instead
(exit code 3), since a newer leader's job has moved on without them (docs/design.md#fencing).
``--report DIR`` makes every rank write what it saw (JSON), which the tests read: at its first
step (its world, and the round's variables) and at its end; ``--trace FILE``
makes rank 0 add a line per step (time, epoch, round, step), from which a test tells whether two
rounds ever trained at once. The ``--fail-*`` options inject failures for the fault-tolerance tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

IN_FEATURES = 8


def parse_args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument(
        "--step-time", type=float, default=0.0, help="seconds to sleep per step (simulated compute)"
    )
    p.add_argument(
        "--until",
        type=float,
        default=None,
        help="stop after the first step that ends past this wall-clock time (seconds since the epoch); "
        "every rank stops at the same step",
    )
    p.add_argument("--checkpoint", type=Path, default=None)
    p.add_argument("--report", type=Path, default=None)
    p.add_argument("--trace", type=Path, default=None, help="rank 0 appends 'time epoch round step' per step")
    p.add_argument(
        "--fail-at-step",
        type=int,
        default=-1,
        help="global rank --fail-rank exits 1 at this step (--steps: after the training, on its way out)",
    )
    p.add_argument("--fail-rank", type=int, default=-1)
    p.add_argument(
        "--fail-once-marker", type=Path, default=None, help="fail only if this file does not exist"
    )
    p.add_argument(
        "--linger", type=float, default=0.0, help="ranks other than 0 wait this long before exiting"
    )
    p.add_argument(
        "--hold-file",
        type=Path,
        default=None,
        help="after training, rank N waits while the file <hold-file>.N exists (tests: a node still busy)",
    )
    p.add_argument("--quiet", action="store_true")
    return p.parse_args()


def log(msg: str) -> None:
    # One write per line: the ranks of a node share one pipe, and unbuffered print() writes the
    # newline separately, which lets two ranks' lines run into each other.
    sys.stdout.write(msg + "\n")
    sys.stdout.flush()


def load_checkpoint(path: Path | None, model: nn.Module, opt: torch.optim.Optimizer) -> int:
    if path is None or not (path / "ckpt.pt").exists():
        return 0
    state = torch.load(path / "ckpt.pt", weights_only=True)
    model.load_state_dict(state["model"])
    opt.load_state_dict(state["opt"])
    return int(state["step"])


FENCED_EXIT_CODE = 3


def this_round() -> tuple[int, int]:
    """(epoch, round) of the rendezvous that started this worker; (0, 0) under other backends."""
    return int(os.environ.get("MINGLE_EPOCH", "0")), int(os.environ.get("MINGLE_ROUND", "0"))


def save_checkpoint(path: Path, model: nn.Module, opt: torch.optim.Optimizer, step: int) -> None:
    """Save the model, tagged with this round, unless a newer epoch wrote the last one.

    ``ckpt.json`` says who wrote ``ckpt.pt``: the job (``--rdzv_id``), epoch, round and step;
    epochs are compared within one job only (a new job starts at epoch 1). The check narrows,
    but cannot close, the window in which two writers on a shared file system race; the
    rendezvous is what keeps two rounds of one job from training at once, this is the last line.
    """
    path.mkdir(parents=True, exist_ok=True)
    epoch, round_number = this_round()
    job = os.environ.get("TORCHELASTIC_RUN_ID", "")  # epochs count within one job (--rdzv_id)
    meta = path / "ckpt.json"
    if meta.exists():
        written = json.loads(meta.read_text())
        if written.get("job") == job and written["epoch"] > epoch:
            log(
                f"fenced: the checkpoint was written under epoch {written['epoch']} round "
                f"{written['round']}, newer than this round's epoch {epoch}; stopping"
            )
            os._exit(FENCED_EXIT_CODE)
    tag = {"job": job, "epoch": epoch, "round": round_number, "step": step}
    tmp = path / f"ckpt.pt.tmp{os.getpid()}"
    torch.save({"model": model.state_dict(), "opt": opt.state_dict(), **tag}, tmp)
    tmp.replace(path / "ckpt.pt")
    tmp_meta = path / f"ckpt.json.tmp{os.getpid()}"
    tmp_meta.write_text(json.dumps(tag))
    tmp_meta.replace(meta)


def maybe_fail(args: argparse.Namespace, rank: int, step: int) -> None:
    if step != args.fail_at_step or rank != args.fail_rank:
        return
    marker = args.fail_once_marker
    if marker is None or not marker.exists():
        if marker is not None:
            marker.touch()
        log(f"rank {rank}: injected failure at step {step}")
        os._exit(1)


def all_past(until: float | None, device: torch.device) -> bool:
    """Whether any rank's clock passed ``until``: every rank gets the same answer (one all-reduce)."""
    if until is None:
        return False
    flag = torch.tensor([float(time.time() >= until)], device=device)
    dist.all_reduce(flag, op=dist.ReduceOp.MAX)
    return bool(flag.item())


def main() -> int:
    args = parse_args()
    t_start = time.time()
    backend = "nccl" if torch.cuda.is_available() and os.environ.get("TRAIN_BACKEND") != "gloo" else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group(backend)
    t_group = time.time()
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if backend == "nccl" else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Linear(IN_FEATURES, 1).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    start_step = load_checkpoint(args.checkpoint, model, opt)
    ddp = DistributedDataParallel(model)  # broadcasts rank 0's parameters to every rank
    t_ddp = time.time()
    env = {
        k: os.environ.get(k, "")
        for k in (
            "MASTER_ADDR",
            "MASTER_PORT",
            "GROUP_RANK",
            "GROUP_WORLD_SIZE",
            "TORCHELASTIC_RESTART_COUNT",
            "GLOO_SOCKET_IFNAME",
            "NCCL_SOCKET_IFNAME",
            "MINGLE_EPOCH",
            "MINGLE_ROUND",
            "SLURM_NODEID",
        )
    }
    if not args.quiet:
        log(
            f"rank {rank}/{world} up: MASTER_ADDR={env['MASTER_ADDR']} MASTER_PORT={env['MASTER_PORT']} "
            f"backend={backend} resuming at step {start_step}"
        )
    t_first = None
    gen = torch.Generator().manual_seed(1234)
    true_w = torch.arange(IN_FEATURES, dtype=torch.float32).unsqueeze(1) / IN_FEATURES
    loss = torch.tensor(0.0)
    steps = args.steps
    for step in range(start_step, args.steps):
        maybe_fail(args, rank, step)
        # Every rank draws its own slice of the same global batch, so the run is reproducible.
        x_all = torch.randn(world * 16, IN_FEATURES, generator=gen)
        x = x_all[rank * 16 : (rank + 1) * 16].to(device)
        y = x @ true_w.to(device)
        opt.zero_grad()
        loss = nn.functional.mse_loss(ddp(x), y)
        loss.backward()  # type: ignore[no-untyped-call]
        opt.step()
        if t_first is None:
            t_first = time.time()
            if args.report is not None:  # at once: this round may be restarted before its end
                args.report.mkdir(parents=True, exist_ok=True)
                first = {
                    "rank": rank,
                    "world_size": world,
                    "t_start": t_start,
                    "t_group": t_group,
                    "t_ddp": t_ddp,
                    "t_first_step": t_first,
                    "env": env,  # the round (MINGLE_EPOCH, MINGLE_ROUND) this world belongs to
                }
                (args.report / f"first-rank{rank}-pid{os.getpid()}.json").write_text(json.dumps(first))
        if rank == 0 and args.checkpoint is not None:
            save_checkpoint(args.checkpoint, model, opt, step + 1)
        if rank == 0 and args.trace is not None:
            epoch, rnd = this_round()
            with args.trace.open("a") as trace:  # one short line per write: appends do not interleave
                trace.write(f"{time.time():.6f} {epoch} {rnd} {step + 1}\n")
        if not args.quiet and (rank == 0 or step == args.steps - 1):
            log(f"rank {rank}/{world} step {step + 1}/{args.steps} loss {loss.item():.5f}")
        if args.step_time:
            time.sleep(args.step_time)
        if all_past(args.until, device):
            steps = step + 1
            break
    dist.barrier()
    params = [p.detach().cpu().flatten().tolist() for p in model.parameters()]
    if args.report is not None:
        args.report.mkdir(parents=True, exist_ok=True)
        report = {
            "rank": rank,
            "world_size": world,
            "steps": steps,
            "start_step": start_step,
            "params": params,
            "loss": float(loss.item()),
            "env": env,
            "pid": os.getpid(),
            "t_start": t_start,
            "t_group": t_group,
            "t_ddp": t_ddp,
            "t_first_step": t_first,
            "t_end": time.time(),
        }
        attempt = env["TORCHELASTIC_RESTART_COUNT"] or "0"
        (args.report / f"rank{rank}-pid{os.getpid()}-attempt{attempt}.json").write_text(json.dumps(report))
    if not args.quiet:
        log(f"rank {rank}/{world} done: final loss {loss.item():.5f}")
    dist.destroy_process_group()
    maybe_fail(args, rank, args.steps)
    if args.linger and rank != 0:
        time.sleep(args.linger)  # rank 0's agent reaches its exit barrier (and shutdown) first
    hold = args.hold_file.with_name(f"{args.hold_file.name}.{rank}") if args.hold_file else None
    while hold is not None and hold.exists():
        time.sleep(0.05)
    return 0


if __name__ == "__main__":
    # DDP keeps the gloo process group alive past destroy_process_group(), and its threads may
    # still be freeing the last all_reduce while Python shuts down; that aborts the process
    # ("terminate called without an active exception", exit -6) after a complete run. Our
    # output is written and the group destroyed: leave without the interpreter's shutdown, on
    # every path (an error after the last step, too: it is printed and the exit code says it).
    try:
        code = main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else int(exc.code is not None)
    except BaseException:  # printed, and the exit code says it
        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
