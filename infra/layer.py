"""The one Lambda layer every function shares: the `gpu_autoscaler` package and its runtime dependencies.

Built on this machine, without Docker: the package is copied as it is, and the dependencies are installed by
pip as manylinux wheels for the Lambda architecture and Python version, so nothing is compiled here and a
laptop on x86 builds a correct arm64 layer. Tests skip the pip step (no network, seconds not minutes) and
get a layer holding the package alone; `cdk synth` and `cdk deploy` build the real one.
"""

from __future__ import annotations

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
    "LAYER_DEPENDENCIES_CONTEXT",
    "PROVIDED_BY_RUNTIME",
    "CoreLayer",
    "PipLayerBundling",
    "layer_dependencies_enabled",
    "runtime_requirements",
]

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = "gpu_autoscaler"

LAYER_DEPENDENCIES_CONTEXT = "gpu-autoscaler:layerDependencies"
"""Context flag: `false` builds the layer from the package alone (tests); anything else pip-installs the deps."""

NOT_NEEDED_AT_RUNTIME = frozenset({"typer", "rich"})
"""Dependencies of the command line only: no function imports them."""

PROVIDED_BY_RUNTIME = ("boto3", "botocore", "s3transfer")
"""Every Lambda Python runtime ships these; pip pulls them in through aws-xray-sdk, and they would add
~35 MB to each cold start for nothing, so they are removed from the layer after the install."""

_PLATFORM_TAG = {"arm64": "aarch64", "x86_64": "x86_64"}


def runtime_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The project's own dependency pins, less what only the command line or the Lambda runtime needs.

    Read from pyproject.toml so the layer and a development install never disagree on versions.
    """
    dependencies: list[str] = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    skipped = NOT_NEEDED_AT_RUNTIME | set(PROVIDED_BY_RUNTIME)
    return [spec for spec in dependencies if _distribution(spec) not in skipped]


def _distribution(spec: str) -> str:
    name = spec
    for stop in "<>=!~[; ":
        name = name.split(stop, 1)[0]
    return name.strip().lower()


def layer_dependencies_enabled(scope: Construct) -> bool:
    value = scope.node.try_get_context(LAYER_DEPENDENCIES_CONTEXT)
    return not (value is False or (isinstance(value, str) and value.strip().lower() in {"false", "0", "no"}))


@jsii.implements(ILocalBundling)
class PipLayerBundling:
    """Lays the layer out as Lambda expects (`python/<package>`), then pip-installs the wheels next to it."""

    def __init__(
        self,
        *,
        package_dir: Path,
        requirements: Sequence[str],
        architecture: str,
        python_version: str,
        install_dependencies: bool,
    ) -> None:
        self.package_dir = package_dir
        self.requirements = list(requirements)
        self.architecture = architecture
        self.python_version = python_version
        self.install_dependencies = install_dependencies

    def try_bundle(self, output_dir: str, *, image: DockerImage, **options: Any) -> bool:
        """Called by CDK at synth with the asset's output directory; True means Docker is never asked."""
        target = Path(output_dir) / "python"
        shutil.copytree(
            self.package_dir,
            target / self.package_dir.name,
            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"),
            dirs_exist_ok=True,
        )
        if self.install_dependencies and self.requirements:
            self._pip_install(target)
        return True

    def pip_command(self, target: Path) -> list[str]:
        return [
            sys.executable, "-m", "pip", "install",
            "--quiet", "--disable-pip-version-check", "--no-compile",
            "--platform", f"manylinux2014_{_PLATFORM_TAG[self.architecture]}",
            "--only-binary=:all:",
            "--implementation", "cp",
            "--python-version", self.python_version,
            "--target", str(target),
            *self.requirements,
        ]  # fmt: skip

    def _pip_install(self, target: Path) -> None:
        result = subprocess.run(self.pip_command(target), capture_output=True, text=True, check=False)
        if result.returncode != 0:
            # Returning False would fall back to Docker, which this project never uses: fail synth instead.
            raise RuntimeError(
                f"building the layer: pip could not install {' '.join(self.requirements)} for "
                f"{self.architecture} / Python {self.python_version}:\n{result.stderr.strip()}"
            )
        for name in PROVIDED_BY_RUNTIME:
            shutil.rmtree(target / name, ignore_errors=True)
            for info in target.glob(f"{name}-*.dist-info"):
                shutil.rmtree(info, ignore_errors=True)
        shutil.rmtree(target / "bin", ignore_errors=True)


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
