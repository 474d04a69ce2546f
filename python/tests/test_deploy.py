# SPDX-License-Identifier: Apache-2.0
"""The deploy files: the systemd unit passes systemd-analyze verify, the
Kubernetes manifests pass kubernetes-validate --strict (and both checks
catch a typo), the shipped config files start a real daemon, and the
image, the DaemonSet and the training pod agree on the command, the tag
and the socket."""

from __future__ import annotations

import fnmatch
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from conftest import BIN, Dataset, start_daemon, stop_daemon
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
                  "python/nvfeed/__pycache__/x.pyc", "python/dali_source/__pycache__/x.pyc"):
        assert ignored(heavy), f"{heavy} is in the build context"
    for needed in ("go.mod", "go.sum", "cmd/loaderd/main.go", "bmap/bmap.go", "python/nvfeed/VERSION",
                   "python/nvfeed/__init__.py", "python/dali_source/__init__.py", "docker/Dockerfile"):
        assert not ignored(needed), f"{needed} is left out of the build context"
