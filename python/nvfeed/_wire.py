# SPDX-License-Identifier: Apache-2.0
"""The messages exchanged with loaderd, as TypedDicts (msgpack maps with
snake_case keys; see cmd/loaderd/internal/wire/wire.go). A Go test
(cmd/loaderd/internal/wire/wire_test.go) checks these against the
daemon's structs, key by key and type by type, both ways."""

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
    shuffle: str  # how random_shuffle shuffles: "permute" or "dali"
    initial_fill: int  # the "dali" shuffle's buffer, in samples
    shuffle_after_epoch: bool  # the whole list permuted anew each epoch, the same on every rank
    shuffle_after_epoch_seed: Optional[int]  # its seed, DALI's int64; absent or None: DALI's default


class Sampling(ReaderArgs):
    n: int  # samples in the dataset
    webdataset: bool  # a webdataset dataset's session (absent otherwise): shard order, permute computed


class Content(TypedDict):
    """A dataset by its samples' names, sizes and labels (bmap.Content):
    the same for every node's copy, whatever its block layout."""
    samples: int
    labels: int  # distinct labels
    digest: str  # 32 hex digits
    chunks: str  # k = min(samples, 64) digests of 16 hex digits, concatenated: chunk i is samples [i*samples/k, (i+1)*samples/k)
    names: List[str]  # each chunk's first sample's name, as the reader names it (a webdataset's "tar/key.{ext,ext}"); empty where the caller may not read them all
    sizes: List[int]  # their sizes
    first_labels: List[int]  # their labels (-1: none)


class Stage(TypedDict):
    """One interrupted run of a resumed epoch (``nvfeed._resume``)."""
    num_shards: int
    batch_size: int
    batch: int  # the batches each of its ranks received


class State(TypedDict, total=False):
    """A session's position: the next batch it will produce. All keys
    but ``stages`` and ``content`` are always there."""
    version: int
    sampling: Sampling
    epoch: int
    batch: int
    content: Optional[Content]  # the dataset's content where it was taken; absent or None: not checked
    stages: List[Stage]  # a resumed epoch's interrupted runs; absent in a whole epoch


class ROI(TypedDict, total=False):
    """fn.readers.numpy's region of interest, under its argument names."""
    roi_start: List[int]
    rel_roi_start: List[float]
    roi_end: List[int]
    rel_roi_end: List[float]
    roi_shape: List[int]
    rel_roi_shape: List[float]
    roi_axes: List[int]
    out_of_bounds_policy: str  # "error", "pad" or "trim_to_shape"
    fill_value: float


class OpenRequest(ReaderArgs, total=False):
    dataset: str
    backend: str
    backend_options: Dict[str, Any]
    prefetch_queue_depth: Optional[int]  # in [1, 64]; absent or None: the daemon's default
    release_after: Optional[int]
    memory: str  # "pinned" or "gpu"
    device_id: int  # the daemon's ordinal: used when device_uuid is ""
    device_uuid: str  # the GPU (memory "gpu"), "GPU-xxxxxxxx-..." as cuDeviceGetUuid gives it; "" unknown
    gpu_path: str  # "auto", "cufile" or "bounce" (memory "gpu" only)
    state: Optional[State]
    fingerprint: str  # the dataset's fingerprint expected ("": any); another one is refused (409)
    files: List[str]  # DALI's files=: the samples read, in order, relative to the map's root or under it
    job_id: str  # the job this session is a rank of ("": none): its sessions must agree (409 otherwise)
    roi: Optional[ROI]  # each sample read as this region (numpy datasets, pinned memory)
    ext: List[str]  # webdataset only: one entry per output, ';'-separated alternatives
    missing_component_behavior: str  # webdataset only: "skip", "empty" ("" too) or "error"
    case_sensitive_extensions: Optional[bool]  # webdataset only: absent means True


class MemoryDesc(TypedDict):
    """A session's batch memory: slot i starts at byte i * slot_size."""
    kind: str  # "pinned" or "gpu"
    size: int
    slot_size: int
    slots: int
    device: int  # the GPU's ordinal in the daemon's process; -1 for host memory
    uuid: str  # the GPU's UUID ("GPU-xxxxxxxx-..."): what the client imports on; "" for host memory
    numa_node: int  # the node the memory is placed on; -1 unknown or not placed


class OpenResponse(TypedDict):
    id: str
    backend: str
    backend_why: str  # why that backend when the request named none; "" when named
    memory: MemoryDesc
    gpu_path: str  # for GPU memory, the path that runs: "cufile" or "bounce"; else ""
    prefetch_queue_depth: int
    release_after: int
    epoch: int  # the first batch's position
    iteration: int
    epoch_batches: int
    state: State  # the position at open, with its sampling
    fingerprint: str  # the dataset's: 32 hex digits, the same on every node holding a copy
    content: Optional[Content]  # the dataset by its samples (names, sizes, labels); absent from a daemon without "content"
    reader: str  # "file" (encoded files, labels) or "numpy" (.npy arrays: batches carry dtype and shapes)
    components: int  # K outputs a sample of a "webdataset" dataset (offsets/lengths: K a sample); 0 otherwise
    not_raw: List[StaleCause]  # gds/bam: raw-mapped samples read through the filesystem, by cause; absent when none
    skipped: int  # webdataset, missing_component_behavior "skip": the samples left out; absent when none
    skipped_lacking: List[int]  # per ext entry, how many of the skipped samples lack it; absent when none


class MemoryResponse(TypedDict):
    """The frame that carries the memory's file descriptor."""
    memory: MemoryDesc


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
    failed: List[int]
    errors: List[str]
    dtype: str  # numpy datasets: the arrays' .npy descr ("<f4", "|u1", ...)
    shapes: List[List[int]]  # numpy datasets: each sample's shape, in batch order ([] for 0-d)
    error: str  # in a stream: it ended with this error
    error_status: int  # and the HTTP status it maps to
    error_code: str  # and its code (as ErrorResponse's)
    stopped: bool  # in a stream: the answer to a stop


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
    device_writes: bool


class BackendsResponse(TypedDict):
    default: str  # the backend used when none is named and the dataset allows no raw reads
    auto: str  # the backend used when none is named over a dataset that allows raw reads
    prefetch_queue_depth: int
    backends: List[BackendSpec]


class DatasetInfo(TypedDict, total=False):
    # Counts only for a caller who may read the dataset ("readable"); "added"
    # only for one who may also list every folder it counts in. Root sees all.
    name: str
    readable: bool  # the caller may read every sample; False: only name, reader and freshness are given
    samples: Optional[int]  # in the map: what sessions serve
    bytes: Optional[int]  # the samples' sizes when mapped, summed
    classes: Optional[int]
    fresh: Optional[int]  # raw samples still readable from their extents
    stale: Optional[int]  # raw samples changed since mapping: read through the filesystem (or failed, if gone)
    writable: Optional[int]  # raw-mapped samples a user the daemon does not trust may change: read through the filesystem
    filesystem_only: Optional[int]  # samples mapped without extents
    pending: Optional[int]  # raw samples the checking pass after the daemon's start has not judged yet: read through the filesystem
    added: Optional[int]  # files in the class folders the map lacks (not served until mkbmap and loaderd reload); -1: unknown; absent: not listable by the caller
    freshness: str  # "watch", "read", "none" (no raw sample) or "unchecked"
    fingerprint: str  # the same on every node holding a copy: its samples' paths, labels and sizes
    reader: str  # "file" or "numpy": the DALI reader whose samples these are
    dtype: str  # numpy: the arrays' .npy descr ("<f4"); "" for file datasets


class DatasetsResponse(TypedDict):
    datasets: List[DatasetInfo]


class StaleCause(TypedDict):
    cause: str  # "changed_since_mapping", "extents_not_the_files", "writable_by_untrusted_users" or "unchecked"
    samples: int  # raw-mapped samples this cause has read through the filesystem
    fix: str  # what makes them raw again


class DatasetStatus(TypedDict, total=False):
    # GET /v1/status: a DatasetInfo with why raw-mapped samples are not read raw.
    name: str
    readable: bool
    samples: Optional[int]
    bytes: Optional[int]
    classes: Optional[int]
    fresh: Optional[int]
    stale: Optional[int]
    writable: Optional[int]
    filesystem_only: Optional[int]
    pending: Optional[int]
    added: Optional[int]
    freshness: str
    fingerprint: str
    reader: str
    dtype: str
    stale_causes: List[StaleCause]  # absent when none (or the caller may not read the dataset)


class SessionInfo(TypedDict):
    uid: int  # the owner (for tcp, the TCP principal)
    tcp: bool
    dataset: str
    backend: str
    memory: str  # "pinned" or "gpu"
    device_id: int
    gpu_path: str
    batch_bytes: int
    sampler_bytes: int
    opened_unix: int
    idle_seconds: float
    streaming: bool
    backend_why: str  # why that backend when its open named none; "" when named


class Budget(TypedDict):
    name: str  # "batch_memory", "sample_order_memory", "sessions", "sessions_of_the_caller", "connections"
    used: int
    limit: int
    source: str  # where the limit came from: a flag, or what a memory budget's default was derived from


class StatusResponse(TypedDict):
    # GET /v1/status (loaderd status): sessions are every one's for root, the caller's own otherwise.
    datasets: List[DatasetStatus]
    sessions: List[SessionInfo]
    budgets: List[Budget]


class Reloaded(TypedDict, total=False):
    dataset: str
    outcome: str  # "reloaded", "added", "removed" or "failed"
    samples: int
    error: str


class ReloadResponse(TypedDict):
    datasets: List[Reloaded]


class ErrorResponse(TypedDict, total=False):
    error: str  # for people
    code: str  # for programs: "rank_mismatch", "not_found", ... (wire.Code*); absent from an older daemon


class NextRequest(TypedDict, total=False):
    release: List[int]
    epoch: Optional[int]  # both or neither: the batch wanted
    iteration: Optional[int]


class ReleaseRequest(TypedDict):
    slot: int


class StreamRequest(TypedDict, total=False):
    epoch: Optional[int]  # both or neither: where the stream starts
    iteration: Optional[int]
    keep: List[int]  # slots of delivered batches still held; every other one is released


class StreamControl(TypedDict, total=False):
    release: List[int]
    stop: bool
    keep: List[int]
