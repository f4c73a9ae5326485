"""The README's Deploy section, followed literally on a fresh account and cluster: each step it shows must work
as written, in the order written (review r12)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()


def _section(title: str) -> str:
    start = README.index(f"\n## {title}")
    end = README.find("\n## ", start + 1)
    return README[start:end]


DEPLOY = _section("Deploy")


def test_the_environment_is_bootstrapped_before_cdk_deploy() -> None:
    """The stack ships file assets (the layer, the functions' code), so `cdk deploy` into an environment never
    bootstrapped stops ("SSM parameter /cdk-bootstrap/hnb659fds/version not found"; CDK v2 guide, bootstrapping)."""
    deploy_at = DEPLOY.index("aws-cdk@2 deploy")
    assert re.search(r"aws-cdk@2 bootstrap", DEPLOY[:deploy_at])


def test_the_functions_rbac_is_applied_before_the_functions_first_tick() -> None:
    """consolidate's schedule starts with the deploy and each tick lists the nodes: without the functions' binding
    the API server refuses it (the Errors alarm, a message a minute on the scheduler's DLQ) until the agent, which
    needs the stack's outputs, is installed. The ClusterRole needs nothing from the stack."""
    deploy_at = DEPLOY.index("aws-cdk@2 deploy")
    assert "kubectl apply -f agent/deploy/functions-rbac.yaml" in DEPLOY[:deploy_at]


def test_the_agent_is_installed_from_an_image_the_cluster_can_pull() -> None:
    """The chart's image has no registry, and Kubernetes takes such a name to be Docker Hub's (kubernetes.io,
    Images), where none is published: the section builds and pushes it, and the install names where."""
    helm = DEPLOY[DEPLOY.index("helm install gpu-autoscaler-agent"):]
    helm = helm[:helm.index("```")]
    assert "docker build -f agent/Dockerfile" in DEPLOY and "docker push" in DEPLOY
    assert "--set image.repository=" in helm


def test_the_agent_install_block_runs_as_written() -> None:
    """No line to omit whose predecessor continues onto it, and one install, not the chart's and kustomize's both."""
    start = DEPLOY.rindex("```bash\n", 0, DEPLOY.index("helm install gpu-autoscaler-agent"))
    block = DEPLOY[start:DEPLOY.index("```", start + 3)]
    assert "omit" not in block and "kubectl apply -k" not in block


def test_no_shell_line_has_a_placeholder_the_shell_reads_as_a_redirection() -> None:
    """`--set queueUrl=<PendingPodsQueueUrl>` pasted into bash reads a file named `PendingPodsQueueUrl`: placeholders
    in a shell block are quoted, or a variable set the line before."""
    found = []
    for block in re.findall(r"```bash\n(.*?)```", README, re.S):
        for line in block.splitlines():
            code = re.sub(r"'[^']*'|\"[^\"]*\"", "", line).split(" #")[0]
            if "<" in code or ">" in code:
                found.append(line)
    assert not found


def test_the_readme_refers_to_no_file_outside_the_repository() -> None:
    outside = re.findall(r"`(\.\./[^`]+)`", README)
    assert not [p for p in outside if not (ROOT / p).resolve().is_relative_to(ROOT)], outside
    assert (ROOT / "docs" / "DESIGN.md").is_file()
