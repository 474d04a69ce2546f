"""The deploy files: the systemd unit passes systemd-analyze verify, the
Kubernetes manifests pass kubernetes-validate --strict (and both checks
catch a typo), and the shipped config files start a real daemon."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from conftest import BIN, Dataset, start_daemon, stop_daemon
from dali_source import LoaderSource

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
