"""kubectl against the local API with the kubeconfig it writes: what the emulator's user does by hand."""

from __future__ import annotations

import json
import shutil
import subprocess
from typing import TYPE_CHECKING

import pytest

from tests.integration.kubernetes.conftest import make_instance, make_pod, wait_for

if TYPE_CHECKING:
    from pathlib import Path

    from gpu_autoscaler.emulator.kubernetes_api import LocalKubernetes

pytestmark = pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl is not installed")


def kubectl(kube: LocalKubernetes, *args: str) -> str:
    done = subprocess.run(["kubectl", "--kubeconfig", str(kube.kubeconfig_path), *args], capture_output=True,
                          text=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_kubectl_creates_lists_drains_and_deletes(kube: LocalKubernetes, tmp_path: Path) -> None:
    kube.add_instance(make_instance())
    node = make_instance().name
    manifest = tmp_path / "pod.json"
    manifest.write_text(json.dumps(make_pod("train-0")))
    wait_for(lambda: node in kubectl(kube, "get", "nodes"), what="node listed")
    assert "pod/train-0 created" in kubectl(kube, "create", "-f", str(manifest))
    wait_for(lambda: kubectl(kube, "get", "pod", "train-0", "-o", "jsonpath={.status.phase}") == "Running",
             what="pod running")
    table = kubectl(kube, "get", "pods", "-o", "wide").splitlines()
    assert table[0].split()[:5] == ["NAME", "READY", "STATUS", "RESTARTS", "AGE"]
    assert table[1].split()[:3] == ["train-0", "1/1", "Running"] and node in table[1]
    assert "Ready" in kubectl(kube, "get", "nodes")
    drained = kubectl(kube, "drain", node, "--ignore-daemonsets", "--force", "--timeout=20s")
    assert "pod/train-0 evicted" in drained
    assert "SchedulingDisabled" in kubectl(kube, "get", "node", node)
    assert "pod/train-0 configured" not in kubectl(kube, "apply", "-f", str(manifest))  # created anew
    assert "train-0" in kubectl(kube, "get", "pods")
    assert 'pod "train-0" deleted' in kubectl(kube, "delete", "pod", "train-0")
