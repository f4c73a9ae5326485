"""The shared layer: what it bundles (the pinned SDK among it), what it leaves out, and its build cache."""

from __future__ import annotations

import ast
import re
import sys
import tomllib
from importlib import metadata
from pathlib import Path
from typing import TYPE_CHECKING

import aws_cdk as cdk
import pytest
from packaging.requirements import Requirement
from packaging.version import Version

import gpu_autoscaler
from infra.layer import (
    BOTOCORE_SERVICES,
    LAYER_DEPENDENCIES_CONTEXT,
    PipLayerBundling,
    layer_dependencies_enabled,
    runtime_requirements,
)
from tests.infrastructure.sources import function_sources

if TYPE_CHECKING:
    from tests.infrastructure.conftest import Synthesized

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = Path(gpu_autoscaler.__file__).parent

FIRST_BOTOCORE_WITH_WHAT_THE_FLEET_SENDS = Version("1.44.0")
"""The first botocore whose EC2 model has both `FleetLaunchTemplateSpecificationRequest.
LaunchTemplateSpecificationUserData` (since 1.43.45) and `ReservedCapacityOptionsRequest.CapacityReservationTarget`
(not in 1.43.67; in 1.44.0), read from botocore's `data/ec2/2016-11-15/service-2.json` of those releases."""


def _names(requirements: list[str]) -> dict[str, Requirement]:
    return {Requirement(spec).name.lower(): Requirement(spec) for spec in requirements}


def test_the_layer_bundles_the_pinned_sdk_and_leaves_out_the_cli() -> None:
    """Issue 14, defect 3: a runtime's own botocore may predate what CreateFleet is sent, so the layer brings
    boto3 and botocore at the pins of pyproject.toml, the one source of versions."""
    pinned = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    requirements = _names(runtime_requirements())
    assert {"pydantic", "aws-lambda-powertools", "boto3", "botocore"} <= set(requirements)
    assert not set(requirements) & {"typer", "rich", "kubernetes"}
    assert set(runtime_requirements()) <= set(pinned)
    lowest = min(Version(s.version) for s in requirements["botocore"].specifier if s.operator in (">=", "=="))
    assert lowest >= FIRST_BOTOCORE_WITH_WHAT_THE_FLEET_SENDS
    assert [s.version for s in requirements["boto3"].specifier if s.operator == ">="] == [
        s.version for s in requirements["botocore"].specifier if s.operator == ">="
    ], "boto3 1.N.x requires botocore 1.N.x: keep their lower bounds together"


def test_layer_dependencies_switch_reads_the_context() -> None:
    for value, expected in ((None, True), ("false", False), (False, False), ("true", True), ("0", False)):
        app = cdk.App(context={} if value is None else {LAYER_DEPENDENCIES_CONTEXT: value})
        assert layer_dependencies_enabled(app) is expected, value


def test_layer_in_tests_holds_the_package_and_no_dependencies(synthesized: Synthesized) -> None:
    assert synthesized.stack.layer.install_dependencies is False
    [asset] = [p for p in synthesized.outdir.glob("asset.*") if (p / "python").is_dir()]
    assert (asset / "python" / "gpu_autoscaler" / "config.py").is_file()
    assert (asset / "python" / "gpu_autoscaler" / "data").is_dir()
    assert sorted(p.name for p in (asset / "python").iterdir()) == ["gpu_autoscaler"]
    assert not list(asset.rglob("__pycache__"))


def _bundling(tmp_path: Path, requirements: list[str] | None = None) -> PipLayerBundling:
    return PipLayerBundling(
        package_dir=PACKAGE,
        requirements=runtime_requirements() if requirements is None else requirements,
        architecture="arm64",
        python_version="3.14",
        install_dependencies=True,
        cache_dir=tmp_path / "cache",
    )


def test_pip_installs_manylinux_wheels_for_the_lambda_platform(tmp_path: Path) -> None:
    command = _bundling(tmp_path).pip_command(Path("/out/python"))
    assert command[:4] == [sys.executable, "-m", "pip", "install"]
    for flag, value in (("--python-version", "3.14"), ("--target", "/out/python"), ("--implementation", "cp")):
        assert command[command.index(flag) + 1] == value
    platforms = [command[i + 1] for i, part in enumerate(command) if part == "--platform"]
    assert platforms == ["manylinux_2_34_aarch64", "manylinux_2_28_aarch64", "manylinux2014_aarch64"]
    assert "--only-binary=:all:" in command


class FakePip:
    """Stands in for pip: lays out the directories a real install of the pins creates, and counts runs."""

    def __init__(self) -> None:
        self.runs = 0

    def __call__(self, target: Path) -> None:
        self.runs += 1
        for relative in (
            "boto3/__init__.py", "botocore/__init__.py", "botocore/data/endpoints.json",
            "botocore/data/ec2/2016-11-15/service-2.json.gz", "botocore/data/s3/x/service-2.json.gz",
            "botocore/data/sqs/x/service-2.json.gz", "numpy/f2py/__init__.py", "bin/normalizer",
            "numpy/core/tests/test_x.py", "pydantic/__pycache__/x.pyc",
        ):  # fmt: skip
            (target / relative).parent.mkdir(parents=True, exist_ok=True)
            (target / relative).write_text("x")


def _bundle(bundling: PipLayerBundling, out: Path) -> Path:
    bundling.try_bundle(str(out), image=cdk.DockerImage.from_registry("unused"))
    return out / "python"


def test_the_built_layer_keeps_the_sdk_and_drops_what_no_function_imports(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    bundling = _bundling(tmp_path)
    monkeypatch.setattr(bundling, "_pip_install", FakePip())
    layer = _bundle(bundling, tmp_path / "out")
    assert (layer / "boto3" / "__init__.py").is_file() and (layer / "botocore" / "__init__.py").is_file()
    assert (layer / "gpu_autoscaler" / "config.py").is_file()
    assert (layer / "botocore" / "data" / "endpoints.json").is_file()
    assert sorted(p.name for p in (layer / "botocore" / "data").iterdir() if p.is_dir()) == ["ec2", "sqs"]
    for gone in ("numpy/f2py", "numpy/core/tests", "bin", "pydantic/__pycache__"):
        assert not (layer / gone).exists(), gone


def test_the_dependencies_are_built_once_per_set_of_pins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Issue 17: synth runs pip only when a pin, the platform or the slimming rules change."""
    pip = FakePip()
    first = _bundling(tmp_path)
    monkeypatch.setattr(first, "_pip_install", pip)
    _bundle(first, tmp_path / "one")
    again = _bundling(tmp_path)
    monkeypatch.setattr(again, "_pip_install", pip)
    assert (_bundle(again, tmp_path / "two") / "boto3" / "__init__.py").is_file()
    assert pip.runs == 1
    changed = _bundling(tmp_path, [*runtime_requirements(), "durationpy>=0.9"])
    monkeypatch.setattr(changed, "_pip_install", pip)
    _bundle(changed, tmp_path / "three")
    assert pip.runs == 2 and changed.cache_key != first.cache_key
    assert not (tmp_path / "one").is_relative_to(ROOT) and not first.cache_dir.is_relative_to(ROOT)


def test_a_failed_install_leaves_nothing_in_the_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    bundling = _bundling(tmp_path)

    def broken(target: Path) -> None:
        raise RuntimeError("building the layer: pip could not install")

    monkeypatch.setattr(bundling, "_pip_install", broken)
    with pytest.raises(RuntimeError, match="pip could not install"):
        _bundle(bundling, tmp_path / "out")
    assert not (bundling.cache_dir / bundling.cache_key).exists()


def _clients_created() -> set[str]:
    """Service names of every `client("...")` in what the functions run (not the emulator, simulator, CLI)."""
    found: set[str] = set()
    for path in function_sources():
        if path.is_relative_to(PACKAGE) and path.relative_to(PACKAGE).parts[0] in {"emulator", "simulation", "cli"}:
            continue
        found.update(re.findall(r"""(?:client|resource)\(\s*["']([a-z0-9-]+)["']""", path.read_text()))
    return found


def test_the_layer_keeps_the_model_of_every_service_the_functions_call() -> None:
    created = _clients_created()
    assert {"ec2", "sqs", "dynamodb"} <= created
    assert created <= BOTOCORE_SERVICES, created - BOTOCORE_SERVICES


def _runtime_imports(path: Path) -> set[str]:
    """Top-level modules a file imports when it runs (not those under `if TYPE_CHECKING:`)."""
    tree = ast.parse(path.read_text())
    skipped = {id(n) for node in ast.walk(tree) if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(
        node.test) for child in node.body for n in ast.walk(child)}  # fmt: skip
    found: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module.split(".")[0])
    return found


def _distributions_installed_by(requirements: list[str]) -> set[str]:
    """The requirements and, through their metadata here, everything they pull in (extras included)."""
    seen: set[str] = set()
    pending = [Requirement(spec) for spec in requirements]
    while pending:
        requirement = pending.pop()
        name = requirement.name.lower().replace("_", "-")
        if name in seen:
            continue
        seen.add(name)
        for spec in metadata.requires(requirement.name) or []:
            child = Requirement(spec)
            extras = requirement.extras or {""}
            if child.marker is None or any(child.marker.evaluate({"extra": extra}) for extra in extras):
                pending.append(child)
    return seen


def test_the_layer_holds_everything_the_functions_import() -> None:
    """A function imports nothing its layer lacks: the packer's numpy was a development dependency only, so
    the deployed packer could not even start; zoneinfo needs tzdata where the runtime has no zone files."""
    shipped = [p for p in PACKAGE.rglob("*.py")
               if p.relative_to(PACKAGE).parts[0] not in {"emulator", "simulation", "cli"}]  # fmt: skip
    modules = set().union(*(_runtime_imports(p) for p in [*shipped, *(ROOT / "functions").rglob("*.py")]))
    third_party = modules - set(sys.stdlib_module_names) - {"gpu_autoscaler", "__future__"}
    owners = metadata.packages_distributions()
    bundled = _distributions_installed_by(runtime_requirements())
    missing = {m: owners.get(m) for m in third_party
               if not any(d.lower().replace("_", "-") in bundled for d in owners.get(m, []))}  # fmt: skip
    assert not missing, f"imported by the functions but not in the layer: {missing}"
    assert "tzdata" in _names(runtime_requirements()), "zoneinfo's fallback when the runtime has no zone files"


def test_no_function_imports_the_kubernetes_client() -> None:
    """Issue 17: the `kubernetes` package is not in the layer, because nothing a function can import (its
    handler's import closure, lazy imports included) imports it: the Kubernetes calls go through
    `adapters.kubernetes.rest`. Its first `CoreV1Api` compiled ~30,000 lines at every cold start."""
    importers = sorted(str(p.relative_to(ROOT)) for p in function_sources() if "kubernetes" in _runtime_imports(p))
    assert not importers, f"these files would need the kubernetes client in the layer: {importers}"
    reached = {str(p.relative_to(PACKAGE)) for p in function_sources() if p.is_relative_to(PACKAGE)}
    assert {"adapters/kubernetes/cluster.py", "adapters/kubernetes/rest.py", "adapters/aws/eks_token.py"} <= reached
