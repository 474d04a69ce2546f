# SPDX-License-Identifier: Apache-2.0
"""torchdata's StatefulDataLoader across a change of world size
(docs/resume.md, Side by side): four ranks (DistributedSampler,
shuffled) read 2 of their 3 batches of epoch 0 and save their
state_dict(); three ranks load ranks 0-2's and finish the epoch. Prints
the samples delivered, duplicates and missing. Ranks are simulated in
one process (the sampler's num_replicas and rank): the loader keeps no
state across ranks.

    .venv/bin/pip install --no-deps --target /tmp/td torchdata==0.11.0
    PYTHONPATH=/tmp/td .venv/bin/python bench/torchdata_resize.py
"""

from collections import Counter

import torch
from torch.utils.data import DistributedSampler
from torchdata.stateful_dataloader import StatefulDataLoader

N, BATCH = 48, 4
data = list(range(N))


def loader(world: int, rank: int) -> StatefulDataLoader:
    s = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=1)
    return StatefulDataLoader(data, batch_size=BATCH, sampler=s)


seen: list[int] = []
states = []
for r in range(4):
    dl = loader(4, r)
    it = iter(dl)
    for _ in range(2):
        seen += next(it).tolist()
    states.append(dl.state_dict())
for r in range(3):
    dl = loader(3, r)
    dl.load_state_dict(states[r])
    for b in dl:
        seen += b.tolist()
c = Counter(seen)
print(f"torchdata StatefulDataLoader, {N} samples, 4 ranks -> 3 from each rank's state: {len(seen)} delivered in "
      f"epoch 0, {sum(n - 1 for n in c.values() if n > 1)} duplicates, {N - len(c)} missing; "
      f"state {len(repr(states[0]))} bytes (repr)")
