#!/usr/bin/env python3
"""The CDK app: configuration from cdk.json's `gpu-autoscaler` context, one stack, cdk-nag AwsSolutions checks.

An invalid configuration stops synth with one line naming each field and its reason; an unsupported Node.js
gets one line naming the version to install (`infra.node`). Nothing here calls AWS: synth needs no credentials.
"""

from __future__ import annotations

import sys

from infra.node import check_node, node_version


def main() -> None:
    check_node(node_version())
    # Imported after the check: importing aws_cdk starts jsii's Node.js process.
    import aws_cdk as cdk

    from gpu_autoscaler.config import ConfigError
    from infra.application import build

    app = cdk.App()
    try:
        build(app)
    except ConfigError as error:
        sys.exit(str(error))
    app.synth()


if __name__ == "__main__":
    main()
