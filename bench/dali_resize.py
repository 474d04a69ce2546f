# SPDX-License-Identifier: Apache-2.0
"""DALI's checkpointing across a change of num_shards (docs/resume.md,
Side by side): a checkpoint restores into a pipeline of another
num_shards without a word; four ranks that read 2 of their 3 batches,
resumed as three from ranks 0-2's checkpoints, deliver epoch 0 with
duplicates and samples missing. CPU only.

    .venv/bin/python bench/dali_resize.py /tmp/dali-resize
"""
import os, sys
import numpy as np
from nvidia.dali import pipeline_def, fn

root = sys.argv[1]
os.makedirs(root, exist_ok=True)
for c in range(2):
    os.makedirs(f"{root}/c{c}", exist_ok=True)
    for i in range(24):
        p = f"{root}/c{c}/{i:03d}.jpg"
        if True:
            open(p, "wb").write(bytes([c, i]) * 16)

@pipeline_def(batch_size=4, num_threads=1, device_id=None, enable_checkpointing=True)
def pipe(shard_id, num_shards):
    data, label = fn.readers.file(file_root=root, shard_id=shard_id, num_shards=num_shards, random_shuffle=True, seed=1, name="r")
    return data, label

p = pipe(shard_id=0, num_shards=4); p.build()
for _ in range(2): p.run()
cpt = p.checkpoint()
print("checkpoint bytes:", len(cpt))
for ns in (4, 3):
    try:
        q = pipe(shard_id=0, num_shards=ns, checkpoint=cpt); q.build()
        out = q.run()
        print(f"restored into num_shards={ns}: ok, first labels {np.array(out[1].as_tensor()).ravel().tolist()}")
    except Exception as e:
        print(f"restored into num_shards={ns}: {type(e).__name__}: {str(e).splitlines()[0][:300]}")

# Four ranks read 2 of their 3 batches of epoch 0 and checkpoint; three
# ranks restore ranks 0-2's checkpoints and finish the epoch.
from collections import Counter
from nvidia.dali.plugin.pytorch import DALIGenericIterator, LastBatchPolicy

def ident(t):
    return bytes(np.asarray(t)).hex()[:8]

seen = []
cpts = []
for r in range(4):
    p = pipe(shard_id=r, num_shards=4); p.build()
    it = DALIGenericIterator(p, ["data", "label"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)
    for _ in range(2):
        b = next(it)[0]
        seen += [ident(x) for x in b["data"]]
    cpts.append(it.checkpoints()[0] if hasattr(it, "checkpoints") else p.checkpoint())
for r in range(3):
    q = pipe(shard_id=r, num_shards=3, checkpoint=cpts[r]); q.build()
    it = DALIGenericIterator(q, ["data", "label"], reader_name="r", last_batch_policy=LastBatchPolicy.PARTIAL, auto_reset=False)
    for b in it:
        seen += [ident(x) for x in b[0]["data"]]
c = Counter(seen)
print(f"DALI 2.4, 48 samples, 4 ranks -> 3 from each rank's checkpoint: {len(seen)} delivered in epoch 0, "
      f"{sum(n - 1 for n in c.values() if n > 1)} duplicates, {48 - len(c)} missing")
