"""``torch-mingle status JOB``: the job as its leader sees it (``_jobview``), now or ``--watch``ed.

The job's leader is found as ``ls`` finds it (it answers a probe with its signed
announcement), then asked over its control port: a hello that says ``observe`` (sealed with the
job's secret where it has one: ``--secret-file``), answered with one ``view`` frame.
"""

from __future__ import annotations

import argparse
import json
import random
import socket
import sys
import time
from typing import Any

from torch_mingle import _doctor
from torch_mingle._doctor import _codec, _listen, _secret_hints, _transports
from torch_mingle._frames import Challenge, Hello, Mismatch, Reject, View, from_leader_stream, leader_frames
from torch_mingle._jobview import render
from torch_mingle._wire import Codec, FrameReader, Invalid, Seal, encode_frame

#: How long the leader's answer may take once connected.
ANSWER_TIMEOUT_S = 5.0


class StatusError(Exception):
    """The job's leader was not found or did not answer; the message says why and what to try."""


def ask(
    ip: str, port: int, epoch: int, leader: int, key: bytes | None, timeout_s: float = ANSWER_TIMEOUT_S
) -> dict[str, Any]:
    """The leader's view of its job, over its control port (``View``)."""
    deadline = time.monotonic() + timeout_s
    seal = Seal(key, leader=False) if key is not None else None
    me = random.getrandbits(63) | 1
    hello = Hello(node=me, epoch=epoch, leader=leader, ip="0.0.0.0", observe=True)  # noqa: S104 - none to give
    reader = FrameReader(from_leader_stream)
    with socket.create_connection((ip, port), timeout=timeout_s) as sock:
        if seal is None:
            sock.sendall(encode_frame("hello", **hello.fields()))
        while True:
            sock.settimeout(max(0.01, deadline - time.monotonic()))
            try:
                data = sock.recv(1 << 20)
            except TimeoutError:
                raise StatusError(f"the leader at {ip}:{port} did not answer within {timeout_s:g}s") from None
            if not data:
                raise StatusError(f"the leader at {ip}:{port} closed the connection without an answer")
            msgs = reader.feed(data)
            if isinstance(msgs, Invalid):
                raise StatusError(f"the leader at {ip}:{port} sent garbage ({msgs.reason})")
            for frame in leader_frames(msgs, seal):
                match frame:
                    case Challenge(nonce=nonce) if seal is not None:
                        sealed = seal.hello(nonce, **hello.fields())
                        if sealed is None:
                            raise StatusError(f"the leader at {ip}:{port} sent a bad challenge")
                        sock.sendall(sealed)
                    case Challenge():
                        raise StatusError(f"the leader at {ip}:{port} uses a secret: pass its --secret-file")
                    case View(view=view):
                        return view
                    case Reject(why=why):
                        raise StatusError(f"the leader at {ip}:{port} refused: {why}")
                    case Mismatch():
                        raise StatusError(f"the leader at {ip}:{port} refused the observer")
                    case Invalid(reason=reason):
                        raise StatusError(f"the leader at {ip}:{port} sent an invalid frame ({reason})")
                    case _:
                        raise StatusError(
                            f"the leader at {ip}:{port} answered with {type(frame).__name__.lower()}, not a "
                            "view: is --secret-file the job's?"
                        )


def run(args: argparse.Namespace) -> int:
    """``torch-mingle status``, with the settings and errors of the other commands (``_doctor.run``)."""
    return _doctor.run(args, cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    """Print the job's view once (exit 1 if nobody answers), or every ``--watch`` seconds."""
    codec = _codec(args)
    while True:
        try:
            view = _once(args, codec)
        except (StatusError, OSError) as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            if not args.watch:
                return 1
        else:
            print(json.dumps(view, indent=2) if args.json else render(args.job, view), flush=True)
            if not args.watch:
                return 0
        time.sleep(args.watch)


def _once(args: argparse.Namespace, codec: Codec) -> dict[str, Any]:
    transports = _transports(args, broadcast=False)
    me = random.getrandbits(63) | 1
    try:
        heard = _listen(transports, codec, args.seconds, me=me, doctor_job=None, probe=True)
    finally:
        for t in transports:
            t.close()
    seen = heard.jobs.get(args.job)
    if seen is None or not seen.control_port:
        hint = "".join(f"; {h}" for h in _secret_hints(heard.invalid, signing=codec.key is not None))
        others = ", ".join(sorted(heard.jobs)) or "none"
        raise StatusError(
            f"no leader of job {args.job!r} answered within {args.seconds:g}s (jobs heard: {others}){hint}"
        )
    return ask(seen.leader_ip, seen.control_port, seen.epoch, seen.leader, codec.key)
