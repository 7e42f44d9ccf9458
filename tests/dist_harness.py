"""Spawn harness of the distributed tests: ``run_ranks(body, world)`` runs ``body(rank, world,
*args)`` on ``world`` CPU ranks with gloo and returns the ranks' results.

The ranks are spawned with torch.multiprocessing (spawn), on a free port chosen here, under a
bounded time; each rank reports its result or its traceback on a queue, and the first failure
(or the deadline) terminates the other ranks and fails the caller: never a hang."""

from __future__ import annotations

import datetime
import os
import queue
import socket
import time
import traceback
from typing import Callable, Optional

import torch.distributed as dist
import torch.multiprocessing as mp

DEADLINE_S = 90.0  # the whole spawn, start-up (imports) included
COLLECTIVE_TIMEOUT = datetime.timedelta(seconds=30)


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _rank_main(rank, world, port, body, args, timeout_s, results):
    try:
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                                world_size=world, timeout=datetime.timedelta(seconds=timeout_s))
        try:
            out = body(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, "ok", out))
    except BaseException:  # pylint: disable=broad-except
        results.put((rank, "error", traceback.format_exc()))


def run_ranks(body: Callable, world: int = 2, deadline_s: float = DEADLINE_S, *,
              args: tuple = (), env: Optional[dict] = None,
              collective_timeout: datetime.timedelta = COLLECTIVE_TIMEOUT) -> list:
    """``body(rank, world, *args)`` on ``world`` spawned ranks (any world size >= 1); its return
    values in rank order. ``body`` and ``args`` must pickle (a module-level function).
    ``env``: environment variables the ranks start with (set here around the spawn, restored
    after). Raises AssertionError with every reported traceback as soon as a rank fails, exits
    without reporting, or the deadline passes; the remaining ranks are terminated."""
    if world < 1:
        raise ValueError(f"run_ranks: world must be >= 1, got {world}")
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    timeout_s = collective_timeout.total_seconds()
    procs = [ctx.Process(target=_rank_main,
                         args=(r, world, port, body, args, timeout_s, results), daemon=True)
             for r in range(world)]
    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    try:
        for p in procs:
            p.start()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    outs, errors = {}, []
    end = time.monotonic() + deadline_s
    try:
        while len(outs) < world and not errors:
            try:
                rank, status, payload = results.get(timeout=0.2)
            except queue.Empty:
                if time.monotonic() > end:
                    errors.append(f"deadline of {deadline_s:.0f} s passed; ranks done: "
                                  f"{sorted(outs)}")
                for r, p in enumerate(procs):
                    if r not in outs and not p.is_alive() and results.empty():
                        errors.append(f"rank {r} exited (code {p.exitcode}) without a result")
                continue
            if status == "ok":
                outs[rank] = payload
            else:
                errors.append(f"rank {rank} raised:\n{payload}")
        # a failed rank's peers may report theirs at once: collect them for the message
        while errors:
            try:
                rank, status, payload = results.get(timeout=0.5)
            except queue.Empty:
                break
            if status != "ok":
                errors.append(f"rank {rank} raised:\n{payload}")
    finally:
        for p in procs:
            if p.is_alive():
                p.terminate()
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise AssertionError("\n".join(errors))
    return [outs[r] for r in range(world)]
