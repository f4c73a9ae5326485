"""teardown: the stack's deletion hook, the two handlers CDK's custom resource Provider framework invokes.

`on_event` for each of the custom resource's Create, Update and Delete, `is_complete` right after it and then
every query interval until it answers true or the Provider's total timeout passes (aws-cdk-lib
`custom_resources.Provider`). Success is the returned data, failure an exception: the framework reports either to
CloudFormation. `services.teardown` does the work.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from aws_lambda_powertools import Logger

from gpu_autoscaler.naming import log_service
from gpu_autoscaler.services.teardown import aws_teardown_hook

if TYPE_CHECKING:
    from aws_lambda_powertools.utilities.typing import LambdaContext

logger = Logger(service=log_service("teardown"))


@logger.inject_lambda_context(clear_state=True)
def on_event(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    logger.info("custom resource event", extra={"requestType": event["RequestType"], "stackId": event["StackId"]})
    return aws_teardown_hook(event).on_event(event)


@logger.inject_lambda_context(clear_state=True)
def is_complete(event: dict[str, Any], context: LambdaContext) -> dict[str, Any]:
    return aws_teardown_hook(event).is_complete(event)
