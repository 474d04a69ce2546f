# SPDX-License-Identifier: Apache-2.0
"""One rank of test_across_nodes.py's two-rank run, under torchrun (gloo):
rank r reads through its own daemon (SOCKETS[r]), each case's dataset in
turn, one epoch each. Writes OUT/rank{R}.json: per case, the epoch's
samples (their digests) or the error raised.

    torchrun --standalone --nproc_per_node 2 content_ranks.py OUT CASES_JSON
"""

from __future__ import annotations

import hashlib
import json
import sys
from typing import Any

import torch
import torch.distributed as dist

from nvfeed import LoaderError
from nvfeed.torch import LoaderDataset


def digest(x: Any) -> str:
    """A sample's digest: a tensor's or bytes' content, a tuple's parts."""
    if isinstance(x, torch.Tensor):
        return hashlib.sha256(x.numpy().tobytes()).hexdigest()[:16]
    if isinstance(x, (bytes, bytearray, memoryview)):
        return hashlib.sha256(bytes(x)).hexdigest()[:16]
    return "+".join(digest(p) for p in x)


def main() -> None:
    out, cases = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    got: dict[str, Any] = {}
    for case in cases:
        try:
            ds = LoaderDataset(case["dataset"], socket=case["sockets"][rank], batch_size=4, **case["kw"])
            seen = []
            for batch in ds:
                # A numpy dataset's batch is its arrays; the others' first output is the samples.
                seen += [digest(s) for s in (batch.unbind(0) if case.get("numpy") else batch[0])]
            ds.close()
            got[case["name"]] = {"samples": seen}
        except LoaderError as e:
            got[case["name"]] = {"error": type(e).__name__, "message": str(e)}
        dist.barrier()
    with open(f"{out}/rank{rank}.json", "w") as f:
        json.dump(got, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
