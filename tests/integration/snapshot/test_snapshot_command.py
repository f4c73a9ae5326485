"""`gpu-autoscaler snapshot` from the command line, on a fresh embedded AWS (one per process: this module runs
after the builder's, whose embedded AWS is gone by then)."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

from typer.testing import CliRunner

from gpu_autoscaler.cli.main import app
from tests.conftest import example_config_data
from tests.integration.snapshot.test_data_volume_snapshot import PUBLIC, bottlerocket_config

if TYPE_CHECKING:
    from pathlib import Path


def test_the_command_prints_the_pools_block_device_mapping(tmp_path: Path) -> None:
    """With `-o json`, as every command takes it (the README's Commands section); `--json` still works."""
    config_file = tmp_path / "config.json"
    config_file.write_text(json.dumps(bottlerocket_config()))
    images = tmp_path / "images.txt"
    images.write_text(f"# the training image\n{PUBLIC}\n\n")
    result = CliRunner().invoke(app, ["snapshot", "--config", str(config_file), "--images-file", str(images),
                                      "--volume-size", "200", "-o", "json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.stdout)
    assert answer["images"] == [PUBLIC] and answer["emulated"] is True
    assert answer["blockDeviceMapping"]["ebs"]["snapshotId"] == answer["snapshotId"]
    assert answer["blockDeviceMapping"]["ebs"]["volumeSize"] == "200Gi"


def test_the_command_refuses_what_it_cannot_build(tmp_path: Path) -> None:
    al2023 = tmp_path / "al2023.json"
    al2023.write_text(json.dumps(example_config_data()))
    runner = CliRunner()
    result = runner.invoke(app, ["snapshot", "--config", str(al2023), "--image", PUBLIC])
    assert result.exit_code == 2 and "Bottlerocket AMI" in result.output
    bottlerocket = tmp_path / "br.json"
    bottlerocket.write_text(json.dumps(bottlerocket_config()))
    result = runner.invoke(app, ["snapshot", "--config", str(bottlerocket), "--image", "nvcr.io/x:1;reboot"])
    assert result.exit_code == 2 and "is not an image reference" in result.output
    result = runner.invoke(app, ["snapshot", "--config", str(bottlerocket), "--image", PUBLIC, "--aws"])
    assert result.exit_code == 2 and "--instance-profile" in result.output
