# SPDX-License-Identifier: Apache-2.0
"""The crash-and-resize run against MosaicML streaming's StreamingDataset
(docs/resume.md, Side by side): 4 ranks read epoch 0 and part of epoch 1,
then crash; 3 ranks resume from rank 0's state_dict(), finish epoch 1 and
read part of epoch 2, then crash; 2 ranks resume and finish epoch 2.
Prints, per epoch, the samples delivered, duplicates and missing.

mosaicml-streaming is not in the project's environment: install it and
what it imports outside it, and point PYTHONPATH there:

    .venv/bin/pip install --no-deps --target /tmp/mosaic mosaicml-streaming==0.13.0 \\
        transformers==4.46.3 huggingface_hub==0.26.5 tokenizers==0.20.3 safetensors==0.4.5 \\
        regex==2024.11.6 requests==2.32.3 urllib3==2.2.3 idna==3.10 certifi==2024.8.30 \\
        charset-normalizer==3.4.0 xxhash==3.5.0 zstd==1.5.5.1 catalogue==2.0.10 Brotli==1.1.0 \\
        python-snappy==0.7.3 cramjam==2.9.0
    PYTHONPATH=/tmp/mosaic .venv/bin/python bench/mosaic_resize.py /tmp/mosaic-run

One rank of a stage runs as ``mosaic_resize.py rank STAGE_JSON`` under
torchrun (gloo, CPU)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

N = 960  # samples: whole batches on 4, 3 and 2 ranks for a fresh epoch
BATCH = 8  # per rank
SEED = 9


def write(local: Path) -> None:
    """N samples of one int field, as MDS shards."""
    from streaming import MDSWriter

    with MDSWriter(out=str(local), columns={"id": "int"}, size_limit=1 << 12) as w:
        for i in range(N):
            w.write({"id": i})


def rank(stage: dict[str, Any]) -> None:
    """One rank: resume (when the stage has a state), finish that epoch
    (when it resumed), read ``partial`` batches of the next, and have
    rank 0 save the state there."""
    import torch.distributed as dist
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    dist.init_process_group("gloo")
    r, world = dist.get_rank(), dist.get_world_size()
    ds = StreamingDataset(local=stage["local"], shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
    seen: dict[str, list[int]] = {}
    epoch = 0
    if stage["state"]:
        st = json.loads(Path(stage["state"]).read_text())
        ds.load_state_dict(st)
        epoch = st["epoch"]
        seen[str(epoch)] = [int(i) for b in DataLoader(ds, batch_size=BATCH) for i in b["id"]]
        epoch += 1
    for _ in range(stage["full"]):
        seen[str(epoch)] = [int(i) for b in DataLoader(ds, batch_size=BATCH) for i in b["id"]]
        epoch += 1
    if stage["partial"]:
        got: list[int] = []
        for k, b in enumerate(DataLoader(ds, batch_size=BATCH)):
            if k == stage["partial"]:
                break
            got += [int(i) for i in b["id"]]
        seen[str(epoch)] = got
        dist.barrier()
        if r == 0:
            state = ds.state_dict(num_samples=world * stage["partial"] * BATCH, from_beginning=True)
            Path(stage["save"]).write_text(json.dumps(state))
    Path(stage["out"], f"rank{r}.json").write_text(json.dumps(seen))
    dist.barrier()
    dist.destroy_process_group()
    os._exit(0)  # a crash: no orderly end of the epoch


def main(work: Path) -> None:
    from streaming.base.util import clean_stale_shared_memory

    local = work / "mds"
    if not local.exists():
        write(local)
    stages = [  # ranks, resumed from, full epochs after, batches of the next before the crash
        {"ranks": 4, "state": None, "full": 1, "partial": 10},
        {"ranks": 3, "state": "s0.json", "full": 0, "partial": 7},
        {"ranks": 2, "state": "s1.json", "full": 0, "partial": 0},
    ]
    per_epoch: dict[str, list[int]] = {}
    for i, st in enumerate(stages):
        clean_stale_shared_memory()
        out = work / f"stage{i}"
        out.mkdir(parents=True, exist_ok=True)
        spec = {"local": str(local), "state": str(work / st["state"]) if st["state"] else None, "full": st["full"],
                "partial": st["partial"], "save": str(work / f"s{i}.json"), "out": str(out)}
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node",
                        str(st["ranks"]), __file__, "rank", json.dumps(spec)], check=True,
                       env=dict(os.environ, OMP_NUM_THREADS="1"))
        for r in range(st["ranks"]):
            for e, ids in json.loads((out / f"rank{r}.json").read_text()).items():
                per_epoch.setdefault(e, []).extend(ids)
    print(f"mosaicml-streaming: {N} samples, batch {BATCH} a rank; 4 ranks crash after 10 batches of epoch 1, "
          "3 ranks resume and crash after 7 batches of epoch 2, 2 ranks resume")
    for e in sorted(per_epoch, key=int):
        c = Counter(per_epoch[e])
        dup = sum(n - 1 for n in c.values() if n > 1)
        missing = N - len(c)
        print(f"epoch {e}: {len(per_epoch[e])} delivered, {dup} duplicates, {missing} missing")
        for i, st in enumerate(json.loads(p.read_text()) for p in sorted(work.glob("s*.json"))):
            if str(st["epoch"]) == e:
                print(f"  state saved in it: {json.dumps(st)} ({len(json.dumps(st))} bytes)")


if __name__ == "__main__":
    if sys.argv[1] == "rank":
        rank(json.loads(sys.argv[2]))
    else:
        main(Path(sys.argv[1]))
