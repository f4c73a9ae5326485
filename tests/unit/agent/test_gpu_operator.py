"""The documented NVIDIA GPU Operator install (README; agent/deploy/gpu-operator/) works on a cluster where its
namespace does not exist yet.

The API server refuses an object in a namespace that does not exist (the NamespaceLifecycle admission plugin:
"ensures that requests in a non-existent Namespace are rejected"), and `helm install -n X` fails the same way
without `--create-namespace`. NVIDIA's own steps for a pre-created plugin ConfigMap create the namespace first
(NVIDIA/k8s-device-plugin README, `kubectl create ns`); the operator's README installs with `--create-namespace`.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import pytest
import yaml

from gpu_autoscaler.emulator.device_plugin import shipped_config_map, shipped_plugin_manifests
from tests.conftest import ROOT

if TYPE_CHECKING:
    from pathlib import Path

OPERATOR = ROOT / "agent" / "deploy" / "gpu-operator"
CONFIG = OPERATOR / "nvidia-device-plugin-config.yaml"
README = ROOT / "README.md"


def test_the_plugin_config_creates_its_namespace_before_its_config_map() -> None:
    """`kubectl apply -f` creates a file's documents in order."""
    documents = [d for d in yaml.safe_load_all(CONFIG.read_text()) if d]
    kinds = [(d["kind"], d["metadata"].get("namespace") or d["metadata"]["name"]) for d in documents]
    assert kinds == [("Namespace", "gpu-operator"), ("ConfigMap", "gpu-operator")]


@pytest.mark.parametrize("path", [README, OPERATOR / "values.yaml"], ids=lambda p: p.name)
def test_the_documented_helm_install_creates_its_namespace(path: Path) -> None:
    commands = re.findall(r"helm install gpu-operator [^`)\n]*", path.read_text())
    assert commands and all("--create-namespace" in c and "-n gpu-operator" in c for c in commands), commands


def test_the_emulator_applies_the_file_as_a_user_does() -> None:
    assert [d["kind"] for d in shipped_plugin_manifests()] == ["Namespace", "ConfigMap"]
    assert shipped_config_map()["metadata"] == {"name": "nvidia-device-plugin-config", "namespace": "gpu-operator"}


@pytest.mark.parametrize("path", [README, OPERATOR / "values.yaml"], ids=lambda p: p.name)
def test_the_nvidia_chart_repository_is_added_before_the_install(path: Path) -> None:
    """`nvidia/gpu-operator` names a chart of the repository `nvidia`, which helm knows only once added (NVIDIA's
    install guide: `helm repo add nvidia https://helm.ngc.nvidia.com/nvidia && helm repo update`)."""
    text = path.read_text()
    assert "helm repo add nvidia https://helm.ngc.nvidia.com/nvidia" in text[:text.index("helm install gpu-operator")]
