"""The one Lambda layer every function shares: the `gpu_autoscaler` package and its runtime dependencies.

Built on this machine, without Docker: the package is copied as it is, and the dependencies are installed by
pip as manylinux wheels for the Lambda architecture and Python version, so nothing is compiled here and a
laptop on x86 builds a correct arm64 layer. Tests skip the pip step (no network, seconds not minutes) and
get a layer holding the package alone; `cdk synth` and `cdk deploy` build the real one.

The installed dependencies are cached outside the repository (`layer_cache_dir`), keyed by the pins, the
platform and the slimming rules: only the first synth after a pin changes runs pip; every other synth copies
the cached tree (hard links where the file system allows) and the package next to it.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import TYPE_CHECKING, Any

import jsii
from aws_cdk import AssetHashType, BundlingOptions, DockerImage, ILocalBundling
from aws_cdk import aws_lambda as lambda_
from constructs import Construct

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = [
    "BOTOCORE_SERVICES",
    "LAYER_CACHE_ENV",
    "LAYER_DEPENDENCIES_CONTEXT",
    "CoreLayer",
    "PipLayerBundling",
    "layer_cache_dir",
    "layer_dependencies_enabled",
    "runtime_requirements",
    "slim",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gpu_autoscaler"

LAYER_DEPENDENCIES_CONTEXT = "gpu-autoscaler:layerDependencies"
"""Context flag: `false` builds the layer from the package alone (tests); anything else pip-installs the deps."""

LAYER_CACHE_ENV = "GPU_AUTOSCALER_LAYER_CACHE"
"""Where the built dependencies are kept; default `$XDG_CACHE_HOME/gpu-autoscaler/layers` (`~/.cache/...`)."""

NOT_NEEDED_AT_RUNTIME = frozenset({"typer", "rich", "kubernetes"})
"""Dependencies no function imports: the command line's (typer, rich) and the `kubernetes` client, which only
the in-cluster agent, the command line and the emulator use; the functions reach the API server through
`gpu_autoscaler.adapters.kubernetes.rest` (its first `CoreV1Api` cost seconds of every cold start, and the
package was a third of the layer). `tests/infrastructure/test_layer.py` checks that no function's import graph
reaches it."""

BOTOCORE_SERVICES = frozenset({
    "cloudformation", "cloudwatch", "dynamodb", "ec2", "eks", "pricing", "service-quotas", "sqs", "ssm", "sts", "xray",
})
"""The AWS APIs the functions call (the infrastructure tests compare this with the code's `client(...)` calls;
CloudFormation: the deletion hook reads its stack's status, `infra.teardown`),
and X-Ray, whose client the X-Ray SDK behind Powertools' Tracer creates at import (`python -m benchmarks
cold-start` imports every handler with the layer alone and fails on a missing model).
The layer ships its own botocore, pinned in pyproject.toml, because the fleet sends CreateFleet members
(`LaunchTemplateSpecificationUserData`, `ReservedCapacityOptions.CapacityReservationTarget`) that a Lambda
runtime's older botocore refuses with ParamValidationError; the other ~430 service models are dropped."""

UNUSED_PATHS = (
    "bin",
    # numpy's Fortran wrapper generator and build helpers: never imported by `import numpy`.
    "numpy/f2py", "numpy/distutils",
)  # fmt: skip
"""Removed after the install, relative to the layer's `python/` directory (with their `*.dist-info`)."""

SLIMMING_VERSION = 3
"""Part of the cache key: bump it when `slim` or its lists change, so no stale cached tree is reused."""

_PLATFORM_TAG = {"arm64": "aarch64", "x86_64": "x86_64"}

MANYLINUX = ("manylinux_2_34", "manylinux_2_28", "manylinux2014")
"""The wheel platforms the Lambda Python runtimes run (Amazon Linux 2023, glibc 2.34): numpy ≥ 2.3 publishes
only manylinux_2_28 wheels for aarch64, so asking for manylinux2014 alone finds no numpy for Python 3.14."""


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's own dependency pins, less what only the command line needs.

    Read from pyproject.toml so the layer and a development install never disagree on versions; boto3 and
    botocore included (see `BOTOCORE_SERVICES`).
    """
    dependencies: list[str] = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    return [spec for spec in dependencies if _distribution(spec) not in NOT_NEEDED_AT_RUNTIME]


def _distribution(spec: str) -> str:
    name = spec
    for stop in "<>=!~[; ":
        name = name.split(stop, 1)[0]
    return name.strip().lower()


def layer_dependencies_enabled(scope: Construct) -> bool:
    value = scope.node.try_get_context(LAYER_DEPENDENCIES_CONTEXT)
    return not (value is False or (isinstance(value, str) and value.strip().lower() in {"false", "0", "no"}))


def layer_cache_dir() -> Path:
    given = os.environ.get(LAYER_CACHE_ENV)
    if given:
        return Path(given)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "gpu-autoscaler" / "layers"


def slim(target: Path) -> None:
    """Delete from an installed layer what no function imports: unused packages, botocore's other service
    models, numpy's own tests, type stubs, byte code and console scripts."""
    for relative in UNUSED_PATHS:
        path = target / relative
        if path.is_dir():
            shutil.rmtree(path)
        for info in target.glob(f"{relative.replace('-', '_')}-*.dist-info"):
            shutil.rmtree(info)
    data = target / "botocore" / "data"
    if data.is_dir():
        for service in data.iterdir():
            if service.is_dir() and service.name not in BOTOCORE_SERVICES:
                shutil.rmtree(service)
    for tests in [p for p in (target / "numpy").rglob("tests") if p.is_dir()]:
        shutil.rmtree(tests, ignore_errors=True)
    for stub in target.rglob("*.pyi"):  # type stubs: read by type checkers, never imported
        stub.unlink()
    for cache in list(target.rglob("__pycache__")):
        shutil.rmtree(cache, ignore_errors=True)


@jsii.implements(ILocalBundling)
class PipLayerBundling:
    """Lays the layer out as Lambda expects (`python/<package>`), the pip-installed wheels next to it."""

    def __init__(
        self,
        *,
        package_dir: Path,
        requirements: Sequence[str],
        architecture: str,
        python_version: str,
        install_dependencies: bool,
        cache_dir: Path | None = None,
    ) -> None:
        self.package_dir = package_dir
        self.requirements = list(requirements)
        self.architecture = architecture
        self.python_version = python_version
        self.install_dependencies = install_dependencies
        self.cache_dir = cache_dir or layer_cache_dir()

    def try_bundle(self, output_dir: str, *, image: DockerImage, **options: Any) -> bool:
        """Called by CDK at synth with the asset's output directory; True means Docker is never asked."""
        target = Path(output_dir) / "python"
        if self.install_dependencies and self.requirements:
            _copy_tree(self.dependencies(), target)
        shutil.copytree(
            self.package_dir,
            target / self.package_dir.name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            dirs_exist_ok=True,
        )
        return True

    @property
    def cache_key(self) -> str:
        """Changes with any pin, the platform, the Python version, or the slimming rules."""
        material = {
            "requirements": sorted(self.requirements),
            "architecture": self.architecture,
            "platforms": list(MANYLINUX),
            "python": self.python_version,
            "slimming": [SLIMMING_VERSION, sorted(UNUSED_PATHS), sorted(BOTOCORE_SERVICES)],
        }
        digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:16]
        return f"{self.architecture}-py{self.python_version}-{digest}"

    def dependencies(self) -> Path:
        """The installed and slimmed dependencies, from the cache, built into it first when absent."""
        cached = self.cache_dir / self.cache_key
        if (cached / ".complete").is_file():
            return cached
        building = self.cache_dir / f"{self.cache_key}.building-{os.getpid()}"
        shutil.rmtree(building, ignore_errors=True)
        self._pip_install(building)
        slim(building)
        (building / ".complete").write_text(json.dumps(self.requirements) + "\n")
        if (cached / ".complete").is_file():  # a concurrent synth finished first: keep its tree, drop ours
            shutil.rmtree(building, ignore_errors=True)
            return cached
        shutil.rmtree(cached, ignore_errors=True)  # an interrupted build's leftovers
        building.rename(cached)  # atomic: a concurrent synth sees a whole tree or none
        return cached

    def pip_command(self, target: Path) -> list[str]:
        return [
            sys.executable, "-m", "pip", "install",
            "--quiet", "--disable-pip-version-check", "--no-compile",
            *(part for glibc in MANYLINUX for part in ("--platform", f"{glibc}_{_PLATFORM_TAG[self.architecture]}")),
            "--only-binary=:all:",
            "--implementation", "cp",
            "--python-version", self.python_version,
            "--target", str(target),
            *self.requirements,
        ]  # fmt: skip

    def _pip_install(self, target: Path) -> None:
        target.parent.mkdir(parents=True, exist_ok=True)
        result = subprocess.run(self.pip_command(target), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            shutil.rmtree(target, ignore_errors=True)
            # Returning False would fall back to Docker, which this project never uses: fail synth instead.
            raise RuntimeError(
                f"building the layer: pip could not install {' '.join(self.requirements)} for "
                f"{self.architecture} / Python {self.python_version}:\n{result.stderr.strip()}"
            )


def _copy_tree(source: Path, target: Path) -> None:
    """Hard links when the cache and the output share a file system (nothing writes to either afterwards),
    copies otherwise."""

    def link_or_copy(src: str, dst: str) -> object:
        try:
            os.link(src, dst)
        except OSError:
            shutil.copy2(src, dst)
        return dst

    shutil.copytree(source, target, copy_function=link_or_copy, dirs_exist_ok=True,
                    ignore=shutil.ignore_patterns(".complete"))  # fmt: skip


class CoreLayer(Construct):
    """The layer version, compatible with exactly the runtime and architecture the functions use."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        runtime: lambda_.Runtime,
        architecture: lambda_.Architecture,
        install_dependencies: bool | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        if install_dependencies is None:
            install_dependencies = layer_dependencies_enabled(self)
        self.install_dependencies = install_dependencies
        python_version = runtime.name.removeprefix("python")
        self.bundling = PipLayerBundling(
            package_dir=ROOT / "layers" / "core" / PACKAGE,
            requirements=runtime_requirements(),
            architecture=architecture.name,
            python_version=python_version,
            install_dependencies=install_dependencies,
        )
        code = lambda_.Code.from_asset(
            str(ROOT / "layers" / "core"),
            # The output hash changes whenever the package, the pins or the platform change.
            asset_hash_type=AssetHashType.OUTPUT,
            bundling=BundlingOptions(
                # Never pulled: local bundling always succeeds or fails synth.
                image=DockerImage.from_registry("local-bundling-only"),
                local=self.bundling,
            ),
        )
        self.layer = lambda_.LayerVersion(
            self,
            "Layer",
            code=code,
            compatible_runtimes=[runtime],
            compatible_architectures=[architecture],
            description=f"{PACKAGE} and its runtime dependencies ({architecture.name}, Python {python_version})",
        )
