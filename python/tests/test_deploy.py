# SPDX-License-Identifier: Apache-2.0
"""The deploy files: the systemd unit passes systemd-analyze verify, the
Kubernetes manifests pass kubernetes-validate --strict (and both checks
catch a typo), the shipped config files start a real daemon, the image,
the DaemonSet and the training pod agree on the command, the tag and the
socket, and a daemon run as the unit and as the DaemonSet's container
run it (their capability sets, no_new_privs, umask, limits, command)
serves a user who is not root byte-exact."""

from __future__ import annotations

import fnmatch
import ctypes
import json
import re
import os
import resource
import shlex
import shutil
import signal
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Optional

import pytest
import yaml

from asuser import nobody, run_as, shared_dir
from conftest import WAIT, BIN, Dataset, skip_unprivileged, small_dataset, start_daemon, stop_daemon
from nvfeed import LoaderSource

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
VALIDATE = Path(sys.executable).parent / "kubernetes-validate"


def _verify_unit(path: Path) -> str:
    r = subprocess.run(["systemd-analyze", "verify", str(path)], capture_output=True, text=True)
    return f"rc={r.returncode} {r.stdout}{r.stderr}".strip()


def test_systemd_unit_verifies(tmp_path: Path) -> None:
    if shutil.which("systemd-analyze") is None:
        pytest.skip("no systemd-analyze here")
    unit = (DEPLOY / "systemd" / "loaderd.service").read_text()
    assert "/usr/local/bin/loaderd" in unit
    assert "\nType=notify\n" in unit and "\nExecReload=/usr/local/bin/loaderd reload " in unit
    good = tmp_path / "loaderd.service"
    good.write_text(unit.replace("/usr/local/bin/loaderd", str(BIN / "loaderd")))  # verify wants the binary to exist
    assert _verify_unit(good) == "rc=0"
    bad = tmp_path / "loaderd-typo.service"
    bad.write_text(good.read_text().replace("NoNewPrivileges=", "NoNewPrivilegez="))
    assert "Unknown key" in _verify_unit(bad), "the check does not catch a typo"


@pytest.mark.parametrize("manifest", ["loaderd.yaml", "training-pod.yaml"])
def test_kubernetes_manifests_validate(manifest: str, tmp_path: Path) -> None:
    path = DEPLOY / "kubernetes" / manifest
    r = subprocess.run([str(VALIDATE), "--strict", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    docs = list(yaml.safe_load_all(path.read_text()))
    docs[-1]["spec"]["unknownField"] = True
    bad = tmp_path / manifest
    bad.write_text(yaml.safe_dump_all(docs))
    r = subprocess.run([str(VALIDATE), "--strict", str(bad)], capture_output=True, text=True)
    assert r.returncode != 0, "--strict does not catch an unknown field"


def _configs() -> dict[str, str]:
    cm = next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / "loaderd.yaml").read_text()) if d["kind"] == "ConfigMap")
    return {"deploy/loaderd.conf": (DEPLOY / "loaderd.conf").read_text(), "the ConfigMap": cm["data"]["loaderd.conf"]}


@pytest.mark.parametrize("which", ["deploy/loaderd.conf", "the ConfigMap"])
def test_shipped_config_starts_a_daemon(which: str, dataset: Dataset, tmp_path: Path) -> None:
    """The config as shipped, with the command line overriding what this
    machine lacks (its socket, group and dataset): the daemon starts,
    takes the file's other settings and serves."""
    conf = tmp_path / "loaderd.conf"
    conf.write_text(_configs()[which])
    d = start_daemon(tmp_path, dataset.bmap, "--config", str(conf), "--socket-group", "")
    try:
        with LoaderSource("train", socket=d.socket, batch_size=5) as src:
            assert sum(len(b) for b, _ in src) == len(dataset.files)
    finally:
        assert stop_daemon(d) == 0, d.log.read_text()


VERSION = (REPO / "python" / "nvfeed" / "VERSION").read_text().strip()


def _dockerfile() -> list[tuple[str, str]]:
    """The instructions of the Dockerfile's last stage (see _dockerfile_all)."""
    instrs = _dockerfile_all()
    last = max(i for i, (k, _) in enumerate(instrs) if k == "FROM")
    return instrs[last:]


def _dockerfile_all() -> list[tuple[str, str]]:
    """Every instruction of docker/Dockerfile, (KEYWORD, rest), continuation
    lines joined, comments dropped."""
    text = (REPO / "docker" / "Dockerfile").read_text().replace("\\\n", " ")
    return [(ln.split(" ", 1)[0].upper(), ln.partition(" ")[2].strip()) for ln in (x.strip() for x in text.splitlines())
            if ln and not ln.startswith("#")]


def _exec_form(instrs: list[tuple[str, str]], kw: str) -> list[str]:
    """The last ENTRYPOINT or CMD, in exec (JSON) form; [] when absent."""
    vals = [rest for k, rest in instrs if k == kw]
    if not vals:
        return []
    assert vals[-1].startswith("["), f"{kw} {vals[-1]} is not in exec form"
    return list(json.loads(vals[-1]))


def _manifest(name: str, kind: str) -> dict[str, Any]:
    return next(d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d["kind"] == kind)


def _argv(container: dict[str, Any], entrypoint: list[str], cmd: list[str]) -> list[str]:
    """The process Kubernetes starts: command replaces the image's
    ENTRYPOINT (and drops its CMD), args replace CMD."""
    if "command" in container:
        return list(container["command"]) + list(container.get("args", []))
    return entrypoint + list(container.get("args", cmd))


def _host_dir(spec: dict[str, Any], container: dict[str, Any], path: str) -> str:
    """The node's directory behind the container's directory of path."""
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    d = os.path.dirname(path)
    assert d in mounts, f"{d} (of {path}) is not a volume mount: {mounts}"
    vol = next(v for v in spec["volumes"] if v["name"] == mounts[d])
    return str(vol["hostPath"]["path"])


def test_daemonset_runs_loaderd_serve_on_the_pods_socket() -> None:
    """The DaemonSet's container, run from docker/Dockerfile's image, is
    `loaderd serve --config FILE`; FILE is the ConfigMap; its socket lies
    in a hostPath directory the training pod mounts, at the path the pod's
    NVFEED_SOCKET names, with a group the pod joins."""
    df = _dockerfile()
    ds = _manifest("loaderd.yaml", "DaemonSet")["spec"]["template"]["spec"]
    c = ds["containers"][0]
    argv = _argv(c, _exec_form(df, "ENTRYPOINT"), _exec_form(df, "CMD"))
    assert argv[:2] == ["loaderd", "serve"], argv
    copied = " ".join(rest for k, rest in df if k == "COPY")
    assert "/out/loaderd" in copied and "/usr/local/bin/" in copied, "loaderd is not on the image's PATH"
    conf_path = argv[argv.index("--config") + 1]
    mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
    cm_vol = next(v for v in ds["volumes"] if v["name"] == mounts[os.path.dirname(conf_path)])
    conf = dict(line.split(" = ", 1) for line in _configs()["the ConfigMap"].splitlines()
                if " = " in line and not line.lstrip().startswith("#"))
    assert cm_vol["configMap"]["name"] == _manifest("loaderd.yaml", "ConfigMap")["metadata"]["name"]
    sock = conf["socket"]
    assert os.path.basename(conf_path) == "loaderd.conf"
    assert c["readinessProbe"]["exec"]["command"] == ["test", "-S", sock]

    pod = _manifest("training-pod.yaml", "Pod")["spec"]
    tc = pod["containers"][0]
    env = {e["name"]: e["value"] for e in tc.get("env", [])}
    assert env.get("NVFEED_SOCKET") == sock, "the pod's NVFEED_SOCKET is not the daemon's socket"
    assert _host_dir(pod, tc, env["NVFEED_SOCKET"]) == _host_dir(ds, c, sock), "the pod mounts another node directory"
    assert int(conf["socket-group"]) in pod["securityContext"]["supplementalGroups"]
    assert conf["socket-mode"] == "0660"
    assert all("--loader-socket" not in a for a in tc["command"]), "a flag nothing reads"


def test_image_tag_version_and_context() -> None:
    """The manifest's image is the tag the Dockerfile's instructions
    build, the build passes the version to -X main.version, and
    .dockerignore keeps the heavy directories out of the context."""
    image = _manifest("loaderd.yaml", "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["image"]
    assert image == f"nvfeed/loaderd:{VERSION}"
    head = [line.lstrip("# ").strip() for line in (REPO / "docker" / "Dockerfile").read_text().splitlines() if line.startswith("#")]
    assert "V=$(cat python/nvfeed/VERSION)" in head
    build = next(line for line in head if line.startswith("docker build "))
    words = build.replace("$V", VERSION).split()
    assert words[words.index("-t") + 1] == image and words[-1] == "." and f"VERSION={VERSION}" in words, build
    assert any(k == "ARG" and rest.startswith("VERSION") for k, rest in _dockerfile_all())
    runs = " ".join(rest for k, rest in _dockerfile_all() if k == "RUN")
    assert "-X main.version=$v" in runs and 'v="${VERSION:-$(cat python/nvfeed/VERSION)}"' in runs

    patterns = [p.strip() for p in (REPO / ".dockerignore").read_text().splitlines() if p.strip() and not p.startswith("#")]

    def ignored(path: str) -> bool:
        parts = path.split("/")
        prefixes = ["/".join(parts[:i]) for i in range(1, len(parts) + 1)]
        return any(fnmatch.fnmatchcase(p, pat) or (pat.startswith("**/") and fnmatch.fnmatchcase(p.rsplit("/", 1)[-1], pat[3:]))
                   for pat in patterns for p in prefixes)

    for heavy in (".venv/bin/python", ".tools/go/bin/go", ".git/HEAD", "bin/loaderd", "build/wheel/loaderd", "dist/x.whl",
                  ".bench/x", ".demo/demo.img", "python/build/lib/x.py", "python/.mypy_cache/x.json",
                  "python/nvfeed/__pycache__/x.pyc", "python/__pycache__/dali_source.cpython-311.pyc"):
        assert ignored(heavy), f"{heavy} is in the build context"
    for needed in ("go.mod", "go.sum", "cmd/loaderd/main.go", "bmap/bmap.go", "python/nvfeed/VERSION",
                   "python/nvfeed/__init__.py", "python/dali_source.py", "docker/Dockerfile"):
        assert not ignored(needed), f"{needed} is left out of the build context"


# ---- The deployment files as they run: a root daemon under the unit's
# (or the container's) capability set serves a user who is not root.


def _unit_service() -> dict[str, list[str]]:
    """The [Service] section of deploy/systemd/loaderd.service: every
    value of each key, in order (systemd merges repeated lines)."""
    out: dict[str, list[str]] = {}
    section = ""
    for line in (DEPLOY / "systemd" / "loaderd.service").read_text().splitlines():
        line = line.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("["):
            section = line
            continue
        if section == "[Service]":
            k, _, v = line.partition("=")
            out.setdefault(k.strip(), []).append(v.strip())
    return out


def _unit_bounding_set(svc: dict[str, list[str]]) -> list[str]:
    """The unit's CapabilityBoundingSet, its lines ORed as systemd does
    (a "~" line, which systemd ANDs in, is not supported here)."""
    caps: list[str] = []
    for v in svc["CapabilityBoundingSet"]:
        assert not v.startswith("~"), f"CapabilityBoundingSet={v}: this test does not model '~' lines"
        caps += [c for c in v.split() if c not in caps]
    return caps


def _limit(v: str) -> tuple[int, int]:
    """A systemd Limit*= value as (soft, hard)."""
    soft, _, hard = v.partition(":")
    conv = [resource.RLIM_INFINITY if x == "infinity" else int(x) for x in (soft, hard or soft)]
    return conv[0], conv[1]


@dataclass
class _Run:
    """How the service manager starts the daemon: the command (a config
    file's path in it to be replaced), the user, the capability bounding
    set (None: the full set, as a privileged container has), whether
    no_new_privs is set, the umask and the resource limits."""
    argv: list[str]
    config: str  # the config file's path as argv names it
    config_text: str
    uid: int = 0
    bounding: Optional[list[str]] = None
    no_new_privs: bool = False
    umask: int = 0o022
    limits: dict[int, tuple[int, int]] = field(default_factory=dict)
    seccomp: Optional[dict[str, Any]] = None  # an OCI seccomp profile (a Localhost one's JSON)


def _seccomp_profile(container: dict[str, Any]) -> Optional[dict[str, Any]]:
    """The seccomp profile a container names: a Localhost one's JSON from
    deploy/kubernetes/seccomp/; None for none (or Unconfined)."""
    prof = container.get("securityContext", {}).get("seccompProfile")
    if not prof or prof["type"] == "Unconfined":
        return None
    assert prof["type"] == "Localhost", f"seccompProfile {prof}: only Localhost profiles are shipped and modelled here"
    return dict(json.loads((DEPLOY / "kubernetes" / "seccomp" / Path(prof["localhostProfile"]).name).read_text()))


SCMP_ACT_ALLOW = 0x7FFF0000


def _seccomp_loader(profile: dict[str, Any], also_deny: tuple[str, ...] = ()) -> Any:
    """A function that installs profile (default action allow, rules
    refusing calls with an errno; also_deny refused too) in the calling
    process through libseccomp, built here so that the child of a fork
    only loads it (a preexec_fn)."""
    lib = ctypes.CDLL("libseccomp.so.2", use_errno=True)
    lib.seccomp_init.restype = ctypes.c_void_p
    lib.seccomp_init.argtypes = [ctypes.c_uint32]
    lib.seccomp_rule_add.argtypes = [ctypes.c_void_p, ctypes.c_uint32, ctypes.c_int, ctypes.c_uint]
    lib.seccomp_load.argtypes = [ctypes.c_void_p]
    lib.seccomp_syscall_resolve_name.argtypes = [ctypes.c_char_p]
    assert profile["defaultAction"] == "SCMP_ACT_ALLOW", "only allow-by-default profiles are modelled here"
    ctx = lib.seccomp_init(SCMP_ACT_ALLOW)
    # As runc loads it for a root container with CAP_SYS_ADMIN: without
    # setting no_new_privs (libseccomp's default), which the container
    # has only with allowPrivilegeEscalation: false.
    lib.seccomp_attr_set.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.c_uint32]
    assert lib.seccomp_attr_set(ctx, 3, 0) == 0  # SCMP_FLTATR_CTL_NNP
    rules = [(r["names"], r.get("errnoRet", 1)) for r in profile["syscalls"] if r["action"] == "SCMP_ACT_ERRNO"]
    assert all(r["action"] in ("SCMP_ACT_ERRNO", "SCMP_ACT_ALLOW") for r in profile["syscalls"]), profile["syscalls"]
    for names, errno in [*rules, (list(also_deny), 1)]:
        for name in names:
            nr = lib.seccomp_syscall_resolve_name(name.encode())
            if nr < 0:
                continue  # not a call of this architecture (vm86 on x86-64)
            assert lib.seccomp_rule_add(ctx, 0x00050000 | errno, nr, 0) == 0, name
    return lambda: lib.seccomp_load(ctx) == 0 or os._exit(99)


def _systemd_run() -> _Run:
    """The unit's ExecStart, CapabilityBoundingSet, NoNewPrivileges,
    UMask, LimitMEMLOCK and LimitNOFILE, as systemd applies them to a
    root service (no User=: uid 0; its permitted and effective sets are
    the bounding set, its inheritable and ambient sets empty)."""
    svc = _unit_service()
    assert "User" not in svc and "AmbientCapabilities" not in svc, "the unit changed its user: extend this test"
    argv = shlex.split(svc["ExecStart"][-1])
    return _Run(argv=argv, config=argv[argv.index("--config") + 1], config_text=(DEPLOY / "loaderd.conf").read_text(),
                bounding=_unit_bounding_set(svc), no_new_privs=svc["NoNewPrivileges"][-1] == "yes",
                umask=int(svc["UMask"][-1], 8),
                limits={resource.RLIMIT_MEMLOCK: _limit(svc["LimitMEMLOCK"][-1]),
                        resource.RLIMIT_NOFILE: _limit(svc["LimitNOFILE"][-1])})


# The capabilities a container runtime (containerd, CRI-O, Docker) gives a
# container that is not privileged and adds or drops none.
RUNTIME_DEFAULT_CAPS = ["CAP_CHOWN", "CAP_DAC_OVERRIDE", "CAP_FSETID", "CAP_FOWNER", "CAP_MKNOD", "CAP_NET_RAW", "CAP_SETGID",
                        "CAP_SETUID", "CAP_SETFCAP", "CAP_SETPCAP", "CAP_NET_BIND_SERVICE", "CAP_SYS_CHROOT", "CAP_KILL",
                        "CAP_AUDIT_WRITE"]


def _kubernetes_run() -> _Run:
    """The DaemonSet's container as the runtime starts it from
    docker/Dockerfile's image: its command, its user (runAsUser, else
    the image's USER, else root), its capabilities (privileged: all; else
    the runtime's defaults with securityContext.capabilities' add and
    drop), no_new_privs (allowPrivilegeEscalation: false) and the
    ConfigMap's config file."""
    df = _dockerfile()
    ds = _manifest("loaderd.yaml", "DaemonSet")["spec"]["template"]["spec"]
    c = ds["containers"][0]
    sc = {**ds.get("securityContext", {}), **c.get("securityContext", {})}
    users = [rest for k, rest in df if k == "USER"]
    user = sc.get("runAsUser", users[-1] if users else 0)
    assert str(user) in ("0", "root"), f"the container runs as {user}: extend this test for a user that is not root"
    argv = _argv(c, _exec_form(df, "ENTRYPOINT"), _exec_form(df, "CMD"))
    bounding: Optional[list[str]] = None
    if not sc.get("privileged", False):
        add = ["CAP_" + a.upper().removeprefix("CAP_") for a in sc.get("capabilities", {}).get("add", [])]
        drop = ["CAP_" + d.upper().removeprefix("CAP_") for d in sc.get("capabilities", {}).get("drop", [])]
        bounding = [] if "CAP_ALL" in drop else [x for x in RUNTIME_DEFAULT_CAPS if x not in drop]
        bounding += [a for a in add if a not in bounding]
    return _Run(argv=argv, config=argv[argv.index("--config") + 1], config_text=_configs()["the ConfigMap"],
                bounding=bounding, no_new_privs=sc.get("allowPrivilegeEscalation") is False, seccomp=_seccomp_profile(c))


def _setpriv(r: _Run) -> list[str]:
    """setpriv's command line giving the daemon r's capabilities as the
    service manager does for uid 0: the bounding set, empty inheritable
    and ambient sets (so exec makes the permitted and effective sets the
    bounding set), no_new_privs."""
    args = ["setpriv"]
    if r.bounding is not None:
        args += ["--bounding-set", ",".join(["-all", *("+" + c.lower().removeprefix("cap_") for c in r.bounding)])]
    args += ["--inh-caps", "-all", "--ambient-caps", "-all"]
    if r.no_new_privs:
        args.append("--no-new-privs")
    return [*args, "--"]


@dataclass
class _LoopDataset:
    root: Path
    bmap: Path
    hashes: list[str]  # sha256 of every sample, sorted


@pytest.fixture(scope="module")
def loop_dataset() -> Iterator[_LoopDataset]:
    """A dataset on a real ext4 filesystem on a loop device (direct I/O),
    in a directory every user can search, its files readable by all."""
    if os.geteuid() != 0 or shutil.which("losetup") is None or shutil.which("setpriv") is None:
        skip_unprivileged("needs root, losetup and setpriv (util-linux): runs the daemon as its unit does")
    if not (BIN / "loaderd").exists():
        skip_unprivileged("bin/loaderd missing: run `make test` (it builds the binaries first)")
    base = shared_dir()
    img, mnt = base / "img", base / "mnt"
    with open(img, "wb") as f:
        f.truncate(64 << 20)
    subprocess.run(["mkfs.ext4", "-q", "-F", "-b", "4096", str(img)], check=True)
    loop = subprocess.run(["losetup", "--find", "--show", "--direct-io=on", str(img)], check=True, capture_output=True,
                          text=True).stdout.strip()
    try:
        mnt.mkdir()
        subprocess.run(["mount", loop, str(mnt)], check=True)
        try:
            mnt.chmod(0o755)
            root, bmap, by_hash = small_dataset(mnt, "train")
            for d, _, names in os.walk(root):
                os.chmod(d, 0o755)
                for name in names:
                    os.chmod(os.path.join(d, name), 0o644)
            bmap.chmod(0o644)
            yield _LoopDataset(root=root, bmap=bmap, hashes=sorted(by_hash))
        finally:
            if subprocess.run(["umount", str(mnt)]).returncode != 0:
                subprocess.run(["umount", "-l", str(mnt)])
    finally:
        subprocess.run(["losetup", "-d", loop])
        shutil.rmtree(base, ignore_errors=True)


def _start_as_deployed(r: _Run, work: Path, bmap: Path, *extra: str,
                       seccomp_deny: tuple[str, ...] = ()) -> tuple[subprocess.Popen[bytes], str, Path]:
    """Starts r's command, the binary this checkout built standing in for
    the installed one, with the config file's text at r's config path's
    stand-in and the command line overriding the socket and the dataset
    (and what extra gives). Returns the process, its socket and its log;
    a daemon that does not start fails the test with its log."""
    assert Path(r.argv[0]).name == "loaderd" and r.argv[1] == "serve", r.argv
    conf = work / "loaderd.conf"
    conf.write_text(r.config_text)
    sockdir = work / "run"  # RuntimeDirectory=loaderd, RuntimeDirectoryMode=0755
    sockdir.mkdir(mode=0o755)
    sockdir.chmod(0o755)
    sock, log = str(sockdir / "loaderd.sock"), work / "loaderd.log"
    argv = [str(BIN / "loaderd"), *(str(conf) if a == r.config else a for a in r.argv[1:]),
            "--socket", sock, "--dataset", f"train={bmap}", *extra]

    # A limit past this process's hard limit needs CAP_SYS_RESOURCE, which
    # a sandbox running the tests may lack: then the hard limit it has.
    want = dict(r.limits)
    if not int(_status(os.getpid())["CapEff"], 16) & (1 << 24):  # CAP_SYS_RESOURCE
        for k, (soft, hard) in r.limits.items():
            cur = resource.getrlimit(k)[1]
            if cur != resource.RLIM_INFINITY and (hard == resource.RLIM_INFINITY or hard > cur):
                warnings.warn(f"limit {k}: {hard} asked, {cur} given (no CAP_SYS_RESOURCE to raise it here)")
                want[k] = (cur if soft == resource.RLIM_INFINITY else min(soft, cur), cur)

    # The container's seccomp profile (and seccomp_deny), installed before
    # setpriv as the runtime installs it before the container's process.
    load = _seccomp_loader(r.seccomp or {"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []}, seccomp_deny) \
        if r.seccomp is not None or seccomp_deny else None

    def limits() -> None:
        for k, v in want.items():
            resource.setrlimit(k, v)
        if load is not None:
            load()

    cmd = [*_setpriv(r), *argv]
    proc = subprocess.Popen(cmd, stdout=open(log, "w"), stderr=subprocess.STDOUT, umask=r.umask,
                            preexec_fn=limits, cwd="/")
    deadline = time.monotonic() + WAIT
    while not os.path.exists(sock):
        if proc.poll() is not None or time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise AssertionError(f"loaderd did not start as deployed ({shlex.join(cmd)}): {log.read_text()}")
        time.sleep(0.02)
    return proc, sock, log


def _status(pid: int) -> dict[str, str]:
    lines = Path(f"/proc/{pid}/status").read_text().splitlines()
    return {k: v.strip() for k, _, v in (ln.partition(":") for ln in lines)}


def _cap_mask(names: list[str]) -> int:
    nums = {ln.split()[0]: i for i, ln in enumerate(subprocess.run(["setpriv", "--list-caps"], capture_output=True,
                                                                   text=True, check=True).stdout.split("\n")) if ln}
    return sum(1 << nums[n.lower().removeprefix("cap_")] for n in names)


SERVE_ALL = """
import hashlib, json, sys
from nvfeed import LoaderError, LoaderSource
out = {}
for be in sys.argv[2:]:
    try:
        with LoaderSource("train", socket=sys.argv[1], batch_size=4, backend=be) as src:
            out[be] = sorted(hashlib.sha256(s.tobytes()).hexdigest() for b, _ in src for s in b)
    except LoaderError as e:
        out[be] = f"{type(e).__name__}: {e}"
print(json.dumps(out))
"""


@pytest.mark.parametrize("how", ["systemd", "kubernetes"])
def test_deployed_daemon_serves_nobody_byte_exact(how: str, loop_dataset: _LoopDataset, tmp_path: Path) -> None:
    """loaderd serve run as deploy/systemd/loaderd.service runs it (its
    exact CapabilityBoundingSet, NoNewPrivileges, UMask, LimitMEMLOCK,
    LimitNOFILE and ExecStart, through setpriv and no systemd), or as the
    DaemonSet's container runs (its security context, the image's user,
    its command and ConfigMap), serves nobody, a member of the socket's
    group, every sample of a real ext4 loop dataset byte-exact through
    file, gds and bam."""
    who = nobody()
    r = _systemd_run() if how == "systemd" else _kubernetes_run()
    conf = dict(ln.split(" = ", 1) for ln in r.config_text.splitlines() if " = " in ln and not ln.lstrip().startswith("#"))
    # The config's socket-group is a name this machine may lack (the unit's)
    # or a gid (the ConfigMap's): nobody joins it by number.
    gid = int(conf["socket-group"]) if conf["socket-group"].isdigit() else 43118
    work = shared_dir()
    proc, sock, log = _start_as_deployed(r, work, loop_dataset.bmap, "--socket-group", str(gid))
    try:
        st = _status(proc.pid)
        if r.bounding is not None:
            # The bounding set can only shrink: what this sandbox lacks stays out.
            mask = _cap_mask(r.bounding) & int(_status(os.getpid())["CapBnd"], 16)
            assert int(st["CapBnd"], 16) == mask and int(st["CapEff"], 16) == mask, (st["CapBnd"], st["CapEff"], r.bounding)
        assert int(st["CapInh"], 16) == 0 and int(st["CapAmb"], 16) == 0, st
        assert st["NoNewPrivs"] == ("1" if r.no_new_privs else "0"), st["NoNewPrivs"]
        assert st["Seccomp"] == ("2" if r.seccomp is not None else "0"), st["Seccomp"]  # 2: a filter
        assert int(st["Umask"], 8) == r.umask, st["Umask"]
        out = run_as(who.pw_uid, who.pw_gid, [gid], SERVE_ALL, sock, "file", "gds", "bam")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
        for be in ("file", "gds", "bam"):
            assert got[be] == loop_dataset.hashes, f"{how}: {be}: {got[be] if isinstance(got[be], str) else 'wrong bytes'}"
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        text = log.read_text()
        shutil.rmtree(work, ignore_errors=True)
    assert code == 0, text
    assert "missing" not in text, f"{how}: the daemon warns of a missing capability:\n{text}"
    assert "engine=uring" in text and "io_uring unavailable" not in text, f"{how}: gds and bam did not read with io_uring:\n{text}"


def test_runtime_default_seccomp_takes_io_uring_away(loop_dataset: _LoopDataset) -> None:
    """Why the DaemonSet ships its own seccomp profile: run as the
    container is but with io_uring refused, as the runtimes' default
    profiles refuse it, the daemon still serves nobody byte-exact through
    file, gds and bam, but gds and bam read with pread workers, warning
    that io_uring is unavailable; under the shipped profile
    (test_deployed_daemon_serves_nobody_byte_exact[kubernetes]) their
    engine is io_uring."""
    who = nobody()
    r = _kubernetes_run()
    assert r.seccomp is not None, "the DaemonSet names no seccomp profile"
    gid = int(dict(ln.split(" = ", 1) for ln in r.config_text.splitlines() if " = " in ln and not ln.lstrip().startswith("#"))["socket-group"])
    work = shared_dir()
    proc, sock, log = _start_as_deployed(r, work, loop_dataset.bmap, "--socket-group", str(gid),
                                         seccomp_deny=("io_uring_setup", "io_uring_enter", "io_uring_register"))
    try:
        out = run_as(who.pw_uid, who.pw_gid, [gid], SERVE_ALL, sock, "file", "gds", "bam")
        assert out.returncode == 0, out.stderr
        got = json.loads(out.stdout)
    finally:
        proc.send_signal(signal.SIGTERM)
        code = proc.wait(timeout=15)
        text = log.read_text()
        shutil.rmtree(work, ignore_errors=True)
    assert code == 0, text
    for be in ("file", "gds", "bam"):
        assert got[be] == loop_dataset.hashes, f"{be}: {got[be] if isinstance(got[be], str) else 'wrong bytes'}"
    assert "raw: io_uring unavailable, using pread workers" in text and "engine=uring" not in text, text


def _caps_go_needs() -> list[str]:
    """The capabilities cmd/loaderd/caps.go's capNeeds lists (with a
    socket group: every one), in its order."""
    src = (REPO / "cmd" / "loaderd" / "caps.go").read_text()
    body = src[src.index("func capNeeds("):]
    body = body[:body.index("\n}\n")]
    caps = re.findall(r"\bunix\.(CAP_[A-Z_]+)\b", body)
    assert len(caps) >= 4, body
    return caps


def test_capabilities_are_what_loaderd_uses() -> None:
    """The DaemonSet's container is not privileged: it drops every
    capability and adds back exactly those cmd/loaderd/caps.go says
    loaderd serve uses (the ConfigMap gives a socket group: CAP_CHOWN
    too); the systemd unit's bounding set is the same list. Its seccomp
    profile is a file this checkout ships, which lets io_uring through."""
    need = sorted(_caps_go_needs())
    sc = _manifest("loaderd.yaml", "DaemonSet")["spec"]["template"]["spec"]["containers"][0]["securityContext"]
    assert not sc.get("privileged", False), sc
    assert [d.upper() for d in sc["capabilities"]["drop"]] == ["ALL"], sc
    assert sorted("CAP_" + a.upper().removeprefix("CAP_") for a in sc["capabilities"]["add"]) == need, sc
    assert sorted(_unit_bounding_set(_unit_service())) == need
    prof = sc["seccompProfile"]
    assert prof["type"] == "Localhost", prof
    shipped = json.loads((DEPLOY / "kubernetes" / "seccomp" / Path(prof["localhostProfile"]).name).read_text())
    denied = {n for rule in shipped["syscalls"] if rule["action"] != "SCMP_ACT_ALLOW" for n in rule["names"]}
    assert shipped["defaultAction"] == "SCMP_ACT_ALLOW" or "io_uring_setup" not in denied
    for used in ("io_uring_setup", "io_uring_enter", "io_uring_register", "mbind", "fanotify_init", "fanotify_mark",
                 "name_to_handle_at", "mlock2", "memfd_create", "setfsuid", "setfsgid", "setgroups"):
        assert used not in denied, used
    for escape in ("open_by_handle_at", "mount", "unshare", "setns", "bpf", "ptrace", "kexec_load", "init_module"):
        assert escape in denied, escape
