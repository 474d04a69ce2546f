"""The messages exchanged with loaderd, as TypedDicts (msgpack maps with
snake_case keys; see internal/serve/api.go)."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypedDict, Union


class ReaderArgs(TypedDict):
    """DALI fn.readers.file's sampling arguments."""
    batch_size: int
    shard_id: int
    num_shards: int
    random_shuffle: bool
    seed: int
    pad_last_batch: bool
    stick_to_shard: bool


class Sampling(ReaderArgs):
    n: int  # samples in the dataset


class State(TypedDict):
    """A session's position: the next batch it will produce."""
    version: int
    sampling: Sampling
    epoch: int
    batch: int


class OpenRequest(ReaderArgs, total=False):
    dataset: str
    backend: str
    backend_options: Dict[str, Any]
    prefetch_queue_depth: int
    release_after: Optional[int]
    memory: str
    state: Optional[State]


class OpenResponse(TypedDict):
    id: str
    shm: str
    shm_size: int
    slots: int
    prefetch_queue_depth: int
    release_after: int
    epoch: int
    epoch_batches: int


class NextResponse(TypedDict, total=False):
    end_of_epoch: bool
    epoch: int
    iteration: int
    epoch_batches: int
    slot: int
    offsets: List[int]
    lengths: List[int]
    labels: List[int]
    indices: List[int]
    errors: List[str]


class BackendOption(TypedDict, total=False):
    name: str
    kind: str  # "int", "bool" or "enum"
    default: Union[int, bool, str]
    min: int
    max: int
    multiple: int
    choices: List[str]
    doc: str


class BackendSpec(TypedDict):
    name: str
    doc: str
    options: List[BackendOption]


class BackendsResponse(TypedDict):
    default: str
    prefetch_queue_depth: int
    backends: List[BackendSpec]
