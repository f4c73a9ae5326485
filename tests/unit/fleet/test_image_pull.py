"""Image pulls at boot: `prePullImages` as a user-data script that runs before the kubelet, and `soci`.

The pre-pull script is run here, with stand-ins for `systemctl`, `ctr` and `aws` on PATH that record their
arguments: the test sees the commands a node would run, in order, not just the text."""

from __future__ import annotations

import email
import os
import shutil
import subprocess
import tomllib
from email.message import Message
from typing import TYPE_CHECKING

import pytest
import yaml

from gpu_autoscaler.config import ConfigError
from gpu_autoscaler.domain.user_data import ClusterBootstrap, node_setup, pre_pull_script, render_user_data
from gpu_autoscaler.models.images import ecr_region, parse_image_reference
from tests.unit.fleet.builders import CA, TYPES, make_config

if TYPE_CHECKING:
    from pathlib import Path

PYTORCH = "nvcr.io/nvidia/pytorch:24.10-py3"
PRIVATE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/team/train@sha256:" + "ab" * 32


def _parts(user_data: str) -> list[tuple[str, str]]:
    message = email.message_from_string(user_data)
    assert message.is_multipart()
    parts = message.get_payload()
    assert isinstance(parts, list)
    found: list[tuple[str, str]] = []
    for part in parts:
        assert isinstance(part, Message)
        payload = part.get_payload()
        assert isinstance(payload, str)  # each part is a document of its own, not nested
        found.append((part.get_content_type(), payload))
    return found


def _al2023(**pool: object) -> str:
    config = make_config(pool_gpu_burst=pool)
    setup = node_setup(config.pool("gpu-burst"), "spot", instance_type=TYPES["g6.xlarge"])
    return render_user_data(ClusterBootstrap.from_config(config), setup)


def test_pre_pull_adds_a_shell_script_part_after_the_node_config() -> None:
    parts = _parts(_al2023(prePullImages=[PYTORCH, PRIVATE]))
    assert [content_type for content_type, _ in parts] == ["application/node.eks.aws", "text/x-shellscript"]
    node_config = yaml.safe_load(parts[0][1])
    assert node_config["kind"] == "NodeConfig" and "featureGates" not in node_config["spec"]
    script = parts[1][1]
    assert script.startswith("#!/bin/bash\n")
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)


def test_without_pre_pull_the_document_holds_only_the_node_config() -> None:
    assert [t for t, _ in _parts(_al2023())] == ["application/node.eks.aws"]


def test_soci_turns_on_fast_image_pull_in_nodeadm() -> None:
    [(_, body)] = _parts(_al2023(soci=True))
    assert yaml.safe_load(body)["spec"]["featureGates"] == {"FastImagePull": True}


def test_soci_on_bottlerocket_selects_the_soci_snapshotter() -> None:
    config = make_config(ami={"family": "Bottlerocket", "version": "1.50.0", "x86_64": "ami-0123456789abcdef0"},
                         pool_gpu_burst={"soci": True})
    bootstrap = ClusterBootstrap(cluster_name="ml-prod", endpoint="https://x.example.com", family="Bottlerocket",
                                 certificate_authority=CA)
    setup = node_setup(config.pool("gpu-burst"), "spot", instance_type=TYPES["g6.xlarge"])
    settings = tomllib.loads(render_user_data(bootstrap, setup))["settings"]
    assert settings["container-runtime"] == {"snapshotter": "soci"}


@pytest.fixture
def node_tools(tmp_path: Path) -> tuple[dict[str, str], Path]:
    """`systemctl`, `ctr`, `aws` and `sleep` that append their arguments to a log; a containerd config."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "calls.log"
    for tool in ("systemctl", "ctr", "aws", "sleep"):
        body = f'#!/bin/bash\necho "{tool} $*" >> "{log}"\n'
        if tool == "aws":
            body += 'echo "TOKEN"\n'
        if tool == "ctr":
            body += 'case "$*" in *flaky*) exit 1 ;; esac\n'
        path = bin_dir / tool
        path.write_text(body)
        path.chmod(0o755)
    env = {"PATH": f"{bin_dir}:{os.environ['PATH']}", "HOME": str(tmp_path)}
    return env, log


def _run(script: str, env: dict[str, str], config: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([shutil.which("bash") or "bash", "-c", script], env={**env, "CONTAINERD_CONFIG": str(config)},
                          text=True, capture_output=True, check=False)


def test_the_script_starts_containerd_then_pulls_each_image_with_the_configured_snapshotter(
        node_tools: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log = node_tools
    config = tmp_path / "config.toml"
    config.write_text('version = 2\n[plugins."io.containerd.grpc.v1.cri".containerd]\n  snapshotter = "soci"\n')
    result = _run(pre_pull_script([PYTORCH, PRIVATE]), env, config)
    assert result.returncode == 0, result.stderr
    calls = log.read_text().splitlines()
    assert calls[0] == "systemctl start containerd"
    pulls = [c for c in calls if c.startswith("ctr ")]
    assert pulls == [
        f"ctr --namespace k8s.io images pull --snapshotter soci --label io.cri-containerd.image=managed {PYTORCH}",
        "ctr --namespace k8s.io images pull --snapshotter soci --label io.cri-containerd.image=managed "
        f"--user AWS:TOKEN {PRIVATE}",
    ]
    assert "aws ecr get-login-password --region us-west-2" in calls


def test_a_failing_pull_is_retried_then_skipped_and_boot_goes_on(
        node_tools: tuple[dict[str, str], Path], tmp_path: Path) -> None:
    env, log = node_tools
    config = tmp_path / "config.toml"
    config.write_text("version = 2\n")  # no snapshotter named: containerd's default
    result = _run(pre_pull_script(["registry.example.com/flaky:1", PYTORCH]), env, config)
    assert result.returncode == 0
    pulls = [c for c in log.read_text().splitlines() if c.startswith("ctr ")]
    assert len(pulls) == 4 and all("--snapshotter overlayfs" in p for p in pulls)
    assert pulls[-1].endswith(PYTORCH)
    assert "could not pre-pull registry.example.com/flaky:1" in result.stderr


@pytest.mark.parametrize(("pool", "reason"), [
    ({"prePullImages": ["nvcr.io/nvidia/pytorch"]}, "names no tag or digest"),
    ({"prePullImages": ["nvcr.io/nvidia/pytorch:1; rm -rf /"]}, "is not an image reference"),
    ({"prePullImages": [PYTORCH, PYTORCH]}, "repeated"),
    ({"soci": True, "prePullImages": []}, "v20250821"),
])
def test_bad_image_settings_are_refused(pool: dict[str, object], reason: str) -> None:
    ami = {"family": "AL2023", "version": "v20250101", "x86_64": "ami-0123456789abcdef0"}
    with pytest.raises(ConfigError, match="gpu-burst|nodePools") as error:
        make_config(ami=ami, pool_gpu_burst=pool)
    assert reason in str(error.value)


def test_bottlerocket_refuses_pre_pull_and_names_the_snapshot() -> None:
    ami = {"family": "Bottlerocket", "version": "1.50.0", "x86_64": "ami-0123456789abcdef0"}
    with pytest.raises(ConfigError, match="gpu-autoscaler snapshot"):
        make_config(ami=ami, pool_gpu_burst={"prePullImages": [PYTORCH]})
    with pytest.raises(ConfigError, match="Bottlerocket 1.45.0"):
        make_config(ami={**ami, "version": "1.30.0"}, pool_gpu_burst={"soci": True})


def test_image_references() -> None:
    ref = parse_image_reference("ubuntu:22.04")
    assert (ref.registry, ref.repository, ref.tag) == ("docker.io", "library/ubuntu", "22.04")
    assert ecr_region(parse_image_reference(PRIVATE)) == "us-west-2"
    assert ecr_region(parse_image_reference(PYTORCH)) is None
    assert not parse_image_reference("localhost:5000/x").pinned


def test_pre_pull_fits_in_the_user_data_limit() -> None:
    many = [f"registry.example.com/team/{'x' * 200}:{i}" for i in range(45)]
    with pytest.raises(ConfigError, match="16 KB"):
        make_config(pool_gpu_burst={"prePullImages": many})
    fits = many[:35]
    user_data = _al2023(prePullImages=fits)
    assert len(user_data.encode()) < 16 * 1024
