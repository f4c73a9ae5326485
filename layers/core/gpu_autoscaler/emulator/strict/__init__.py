"""The strict layer: what AWS refuses, refused before moto sees it.

moto accepts many requests that AWS refuses (tags for resource types a request does not create, EFA
interfaces on types without EFA, a capacity reservation of another instance type...). Code tested only
against moto would pass and then fail on its first real deployment. This layer is a WSGI middleware
around moto's server application (`StrictLayer`, installed by `emulator.aws.EmbeddedAws`), so every
client — handlers, tests, `invoke`, the emulator and the demo — goes through it unchanged.

How a request flows:

1. The service is read from the SigV4 credential scope and the action from the request (EC2/query
   protocols: the `Action` form field; JSON protocols: `X-Amz-Target`). Services without rules pass
   straight through, their body untouched.
2. The parameters are parsed back into the shape boto3 takes (`TagSpecifications[0]["ResourceType"]`),
   with botocore's own service model, so rules read the documented API names, not the wire encoding.
3. Every **check** registered for (service, action) runs in registration order; the first to raise
   `Refusal(code, message)` ends the request with that error in the service's wire format (EC2:
   `<Response><Errors><Error><Code>…`; query: `<ErrorResponse>`; JSON: `__type`).
4. Then every **answer** registered for it runs; the first that returns an `Answer` (a dict the
   service's output shape serializes, or raw bytes) is sent instead of moto's. This is how actions moto
   lacks (DescribeCapacityReservations) are stood in for; `request.forward(params)` asks moto on the
   stand-in's behalf (with other parameters if need be) and hands back its parsed answer to build on.
5. Otherwise moto answers. Then every **after** hook registered for it sees the answer and may complete
   moto's state with what AWS would also have done (the volumes a launch maps, for instance).

How a rule module plugs in (one module per service, named after it: `ec2.py`, `iam.py`, `events.py`; a
stand-in for an API moto lacks sits beside it as `<service>_<what>.py`: `ec2_capacity_reservations.py`,
`ec2_placement_groups.py`):

    from gpu_autoscaler.emulator.strict.core import AwsRequest, Refusal, check

    @check("ec2", "RunInstances", "CreateFleet")
    def _no_spot_request_tags_without_spot(request: AwsRequest) -> None:
        # Source: <AWS documentation URL, section>
        if ...:
            raise Refusal("InvalidParameterValue", "exact AWS message")

Every module in this package other than `core` and `wire` is imported by `load_rules()` (so a new
module needs no registration anywhere else). A rule reads only the request and moto's own state
(`request.moto_backend()`, or `request.ec2_launch_template_data(...)`), never the project's decision
code: the layer is an independent witness of AWS's documented behaviour. Each rule cites the AWS
documentation it implements in a comment, and answers with AWS's exact error code and message.

A stand-in that keeps state registers `@on_reset` to forget it when moto's state is reset.
`strict_layer_disabled()` turns the layer off for one block of a test that must see moto's own answer.
"""

from __future__ import annotations

from gpu_autoscaler.emulator.strict.core import (
    Answer,
    AwsRequest,
    Refusal,
    StrictLayer,
    after,
    answer,
    before_any,
    check,
    load_rules,
    on_reset,
    strict_layer_disabled,
)

__all__ = [
    "Answer",
    "AwsRequest",
    "Refusal",
    "StrictLayer",
    "after",
    "answer",
    "before_any",
    "check",
    "load_rules",
    "on_reset",
    "strict_layer_disabled",
]
