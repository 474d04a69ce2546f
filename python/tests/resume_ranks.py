# SPDX-License-Identifier: Apache-2.0
"""One rank of test_resume.py's runs, under torchrun (gloo): every rank
reads three LoaderDatasets at once (images, tensors, a WebDataset), a
step taking one batch of each that has one left in the epoch. Every rank
appends what it received to OUT/received.jsonl, tagged (run, step); once
all have, rank 0 saves the checkpoint OUT/ck/NNNNNN.json (the loop's
epoch, the datasets that ended it, each dataset's state_dict(), and the
run and step it commits). A step counts as trained where its checkpoint
is there: a crash at any moment loses none and repeats none. At epoch
1, loop batch CRASH (-1: never) the last rank kills itself with SIGKILL
after the checkpoint. A run resumes from the last checkpoint (rank 0's,
on every rank); under an elastic agent a restart does the same.
RESUME_STEP_SLEEP slows each step (seconds).

    torchrun ... resume_ranks.py SOCKET OUT BATCH EPOCHS CRASH PAD
"""

from __future__ import annotations

import datetime
import hashlib
import json
import os
import signal
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.distributed as dist

from nvfeed.torch import LoaderDataset

KINDS = {"imgs": {}, "list": {}, "tens": {}, "wds": {"ext": ["bin", "cls"]}}
INIT_LIMIT = 45.0
"""Seconds a worker waits for its process group before it exits (3)."""


def ids(kind: str, batch: Any) -> list[str]:
    """Each sample's content hash."""
    if kind == "wds":
        samples = batch[0]
    elif kind == "tens":
        samples = list(batch.unbind(0)) if isinstance(batch, torch.Tensor) else list(batch)
    else:
        samples = batch[0]
    out = []
    for s in samples:
        data = bytes(s) if isinstance(s, (bytes, bytearray)) else s.contiguous().numpy().tobytes()
        out.append(hashlib.sha256(data).hexdigest()[:16])
    return out


def save(path: Path, ck: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(ck))
    os.replace(tmp, path)


def main() -> None:
    sock, out, batch, epochs, crash, pad = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), \
        int(sys.argv[5]), sys.argv[6] == "1"
    # A bounded wait: an elastic round that forms wrong (a peer of the last
    # round still listed) fails the workers instead of hanging them, and
    # torchrun's next restart forms it again. gloo's default is 30 minutes.
    # gloo's connection of the ranks' pairs (connectFullMesh) does not keep
    # to that timeout: after a node is lost it was seen waiting for a peer
    # for minutes while its agent waited on it. A watchdog ends this worker
    # instead, so that the agent forms the next round.
    watchdog = threading.Timer(INIT_LIMIT, lambda: os._exit(3))
    watchdog.daemon = True
    watchdog.start()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=90))
    watchdog.cancel()
    rank, world = dist.get_rank(), dist.get_world_size()
    tags = [f"w{world}b{batch}@{time.time_ns()}"]
    dist.broadcast_object_list(tags, src=0)
    tag, pause = tags[0], float(os.environ.get("RESUME_STEP_SLEEP", "0"))
    ds = {k: LoaderDataset(k, socket=sock, batch_size=batch, random_shuffle=True, seed=5, pad_last_batch=pad, **kw)
          for k, kw in KINDS.items()}
    ckdir = out / "ck"
    ckdir.mkdir(exist_ok=True)
    cks = sorted(ckdir.glob("*.json"))
    start, done, step = 0, set(), len(cks)
    if cks:
        ck = json.loads(cks[-1].read_text())
        start, done = ck["epoch"], set(ck["done"])
        for k, d in ds.items():
            d.load_state_dict(ck["states"][k])
    for e in range(start, epochs):
        its: dict[str, Iterator[Any]] = {}
        for k, d in ds.items():
            if k not in done:
                d.set_epoch(e)
                its[k] = iter(d)
        while its:
            got: dict[str, tuple[int, list[str]]] = {}
            for k in list(its):
                at = ds[k].state_dict()["batch"]
                try:
                    got[k] = (at, ids(k, next(its[k])))
                except StopIteration:
                    del its[k]
                    done.add(k)
            with open(out / "received.jsonl", "a") as f:
                for k, (at, samples) in got.items():
                    f.write(json.dumps({"run": tag, "step": step, "rank": rank, "kind": k, "epoch": e, "batch": at,
                                        "ids": samples}) + "\n")
            dist.barrier()
            if rank == 0:
                save(ckdir / f"{step:06d}.json", {"run": tag, "step": step, "epoch": e if its else e + 1,
                                                  "done": sorted(done) if its else [],
                                                  "states": {k: d.state_dict() for k, d in ds.items()}})
            dist.barrier()
            step += 1
            time.sleep(pause)
            if e == 1 and rank == world - 1 and any(at == crash for at, _ in got.values()):
                (out / f"killed-w{world}").write_text(f"step {step}\n")  # the test's proof that the crash was this one
                os.kill(os.getpid(), signal.SIGKILL)
        done = set()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
