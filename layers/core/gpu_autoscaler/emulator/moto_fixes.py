"""Where moto's behaviour differs from AWS in a way our handlers would notice, corrected in-process.

The embedded server runs in this process, so a correction is a small change to moto's module state,
applied once before the server starts. Each one names the difference it removes.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any

__all__ = ["EC2_REQUESTS", "apply"]

log = logging.getLogger(__name__)

_applied = False

EC2_REQUESTS = threading.RLock()
"""Held while one EC2 request is served, moto's part and the strict layer's (`_serialize_ec2`)."""


def apply() -> None:
    """Idempotent; call before the first request reaches the embedded server."""
    global _applied
    if _applied:
        return
    _event_account()
    _quiet_unknown_services()
    _answer_what_moto_lacks()
    _serialize_dynamodb()
    _items_written_as_json()
    _queries_read_their_partition()
    _serialize_ec2()
    _serialize_sqs_receives()
    _retention_read_from_the_queue()
    _transactions_without_table_copies()
    _instance_pages_that_survive_changes()
    _node_role_policies()
    _cluster_access()
    _applied = True


def _event_account() -> None:
    """EventBridge delivers every event to a target with its `account`; moto's default target input drops it.

    Without it, a rule's SQS target receives an event Powertools' `EventBridgeModel` rejects (`account` is
    required), so the interruption function would fail every event put on the bus.
    """
    from moto.events.utils import EventTemplateParser

    template = json.loads(
        EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE.replace("<time>", "0")
        .replace("<resources>", "[]")
        .replace("<detail>", "{}")
    )
    if "account" in template:
        return  # a moto that already delivers it
    EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE = EventTemplateParser.DEFAULT_EVENT_INPUT_TEMPLATE.replace(
        '"source": "<source>",', '"source": "<source>", "account": "<account>",', 1
    )


NODE_ROLE_POLICIES = ("AmazonEKSWorkerNodePolicy", "AmazonEC2ContainerRegistryPullOnly", "AmazonEKS_CNI_Policy")
"""The AWS managed policies of an EKS node role (EKS User Guide, create-node-role.adoc; Karpenter's getting-started
cloudformation.yaml attaches these three)."""


def _node_role_policies() -> None:
    """AWS managed policies exist in every account; moto has them only when told to load all of them
    (`MOTO_IAM_LOAD_MANAGED_POLICIES`, some 1,300 built for each account's IAM backend). An account without any
    refuses to attach them (`NoSuchEntity`), so the emulator's node role could not hold what a real one holds:
    the node role's policies are loaded here, from moto's own copy of their documents."""
    from moto.iam.aws_managed_policies import aws_managed_policies_data
    from moto.iam.models import AWSManagedPolicy, IAMBackend

    data = json.loads(aws_managed_policies_data)
    original = IAMBackend._init_aws_policies

    def init_aws_policies(self: Any) -> list[Any]:
        return original(self) or [AWSManagedPolicy.from_data(name, self.account_id, self.region_name, data[name])
                                  for name in NODE_ROLE_POLICIES]

    IAMBackend._init_aws_policies = init_aws_policies  # type: ignore[method-assign]


def _cluster_access() -> None:
    """moto's CreateCluster drops `accessConfig` and keeps `resourcesVpcConfig` as sent, so DescribeCluster tells
    neither the authentication mode nor who may reach the API endpoint. EKS fills both with its defaults (EKS API
    reference: CreateAccessConfigRequest, "If you create a cluster by using the EKS API, AWS SDKs, or AWS
    CloudFormation, the default is CONFIG_MAP", `bootstrapClusterCreatorAdminPermissions` true; VpcConfigRequest,
    `endpointPublicAccess` true, `endpointPrivateAccess` false, `publicAccessCidrs` 0.0.0.0/0)."""
    from moto.eks.responses import EKSResponse

    original = EKSResponse.create_cluster

    def create_cluster(self: Any) -> Any:
        result = original(self)
        cluster = self.eks_backend.clusters[self._get_param("name")]
        access = self._get_param("accessConfig") or {}
        cluster.access_config = {
            "authenticationMode": access.get("authenticationMode", "CONFIG_MAP"),
            "bootstrapClusterCreatorAdminPermissions": access.get("bootstrapClusterCreatorAdminPermissions", True)}
        vpc = cluster.resources_vpc_config
        vpc.setdefault("endpointPublicAccess", True)
        vpc.setdefault("endpointPrivateAccess", False)
        vpc.setdefault("publicAccessCidrs", ["0.0.0.0/0"])
        return result

    EKSResponse.create_cluster = create_cluster  # type: ignore[method-assign]


def _quiet_unknown_services() -> None:
    """A request for a service moto does not have (the Pricing API) gets an error, as it should; moto also
    `print`s a line about it to the process's stdout, in the middle of the emulator's console. Log it instead."""
    from moto import backends
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original = DomainDispatcherApplication.get_backend_for_host
    # Which backend serves a host never changes, and moto works it out on every request — listing its package
    # directory and trying hundreds of URL patterns — under a lock every request takes: at a few hundred
    # requests a second that serialised the server. Each host is worked out once here.
    found: dict[str | None, Any] = {}

    def get_backend_for_host(self: Any, host: str | None) -> Any:
        if host in found:
            return found[host]
        if host and "amazonaws.com" in host and host not in backends.list_of_moto_modules() and not any(
            pattern.match(f"http://{host}") for _, pattern in self.backend_url_patterns
        ):
            log.debug("no moto backend for %s", host)
            backend = None
        else:
            backend = original(self, host)
        found[host] = backend
        return backend

    DomainDispatcherApplication.get_backend_for_host = get_backend_for_host  # type: ignore[method-assign]


def _answer_what_moto_lacks() -> None:
    """A service moto does not have, or an action it has not implemented, is answered as an error response.

    moto fails such a request inside its WSGI app (an `AttributeError` while it builds an app for no backend, a
    `NotImplementedError` from the action); werkzeug then prints the traceback on stderr and answers 500, and
    the client sees a response it cannot parse. AWS answers an action a service does not support with HTTP 400
    and the error code `InvalidAction` (EC2 API reference, "Common client error codes"; the JSON protocols'
    `UnknownOperationException`); the emulator answers the same way, in the request's protocol, and logs one
    line at DEBUG.
    """
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication

    original_get_application = DomainDispatcherApplication.get_application

    def get_application(self: Any, environ: dict[str, Any]) -> Any:
        try:
            return original_get_application(self, environ)
        except AttributeError:  # no backend: moto cannot build an app for `None`
            return _unsupported

    def call(self: Any, environ: dict[str, Any], start_response: Any) -> Any:
        try:
            return self.get_application(environ)(environ, start_response)
        except NotImplementedError as error:
            return _unsupported(environ, start_response, str(error))

    DomainDispatcherApplication.get_application = get_application  # type: ignore[method-assign]
    DomainDispatcherApplication.__call__ = call  # type: ignore[method-assign]


def _serialize_dynamodb() -> None:
    """DynamoDB serves concurrent requests, each one atomic ("DynamoDB transactions", "Isolation levels":
    TransactWriteItems is serializable with respect to every other write); moto's backend is not thread-safe:
    TransactWriteItems deep-copies a table while another request thread writes to it and fails with "dictionary
    changed size during iteration" (HTTP 500, a retry storm in the functions' clients). The embedded server
    serves each request on its own thread, so DynamoDB requests are taken one at a time here.
    """
    from moto.dynamodb.responses import DynamoHandler

    lock = threading.Lock()
    original = DynamoHandler.call_action

    def call_action(self: Any) -> Any:
        with lock:
            return original(self)

    DynamoHandler.call_action = call_action  # type: ignore[method-assign]


_ITEM_LISTS = {"Query": "Items", "Scan": "Items", "BatchGetItem": "Responses"}
"""The answers whose size grows with the table: their items go out as JSON, the rest through moto's serializer."""


def _items_written_as_json() -> None:
    """moto's response serializer walks the API's output shape for every attribute value of every item (a
    `{"S": ...}` map is a structure of ten optional members, each looked up by alias): two thirds of the time of
    a Query of 750 claims, and the packer reads every live claim per document, so the emulator's cost, not
    DynamoDB's, grew with the claims kept. Items are already DynamoDB JSON (`dynamo_to_dict`): they are written
    as they are, binary values base64-encoded as on the wire ("Data types", DynamoDB Developer Guide); the
    answer's other members (counts, keys, consumed capacity) still go through moto's serializer."""
    import base64

    from moto.core.responses import ActionResult
    from moto.dynamodb.responses import DynamoResult

    original = DynamoResult.execute_result

    def wire(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: wire(v) for k, v in value.items()}
        if isinstance(value, list):
            return [wire(v) for v in value]
        if isinstance(value, bytes):
            return base64.b64encode(value).decode()
        return value

    def execute_result(self: Any, context: Any) -> Any:
        member = _ITEM_LISTS.get(context.operation_model.name)
        result = self.result
        if member is None or not isinstance(result, dict) or member not in result:
            return original(self, context)
        status, headers, body = original(ActionResult({k: v for k, v in result.items() if k != member}), context)
        answer = json.loads(body)
        answer[member] = wire(result[member])
        return status, headers, json.dumps(answer)

    DynamoResult.execute_result = execute_result  # type: ignore[method-assign]


def _queries_read_their_partition() -> None:
    """A Query reads one partition, and within it only the sort keys its key condition names ("Query operations
    in DynamoDB": the items come from the key range, in sort key order, before any filter). moto walks every
    item of the table, sorts the partition by comparing DynamoType objects, then tests the condition on each: the
    packer's read of its claims cost as much as every pod assignment, boot sample and demand bucket stored beside
    them. The table's own query then sees only the partition's items its key condition selects; everything after
    (order, pages, limits, filters, projections, copies) is still moto's."""
    from moto.dynamodb.models.table import Table

    original = Table.query

    def query(self: Any, hash_key: Any, range_comparison: str | None, range_objs: list[Any], limit: Any,
              exclusive_start_key: Any, scan_index_forward: Any, projection_expressions: Any,
              index_name: str | None = None, *args: Any, **kwargs: Any) -> Any:
        if index_name or hash_key is None or not self.range_key_attr or hash_key not in self.items:
            return original(self, hash_key, range_comparison, range_objs, limit, exclusive_start_key,
                            scan_index_forward, projection_expressions, index_name, *args, **kwargs)
        partition = self.items[hash_key]
        if range_comparison is None:
            rows = list(partition.values())
        elif range_comparison.upper() == "BEGINS_WITH" and all(o.type == "S" for o in range_objs):
            prefix = range_objs[0].value
            rows = [item for key, item in partition.items() if key.type == "S" and key.value.startswith(prefix)]
        else:
            rows = [item for key, item in partition.items() if key.compare(range_comparison, range_objs)]
        self.all_items = lambda: rows  # this call's view of the table (requests are served one at a time)
        try:
            return original(self, hash_key, range_comparison, range_objs, limit, exclusive_start_key,
                            scan_index_forward, projection_expressions, index_name, *args, **kwargs)
        finally:
            del self.all_items

    Table.query = query  # type: ignore[method-assign]


def _serialize_ec2() -> None:
    """EC2 serves concurrent requests, and what one request did is all there or not at all for the next (a
    CreateFleet's instances, with their tags); moto's EC2 backend has no locks: DescribeInstances renders each
    instance's tags by walking every tagged resource, and the strict layer's rules walk the reservations, while
    a CreateFleet, CreateTags or TerminateInstances on another request thread changes them. The embedded server
    serves each request on its own thread, so EC2 requests are taken one at a time here, as DynamoDB's are:
    moto's action under `EC2_REQUESTS`, which the strict layer also holds for a whole EC2 request (its checks,
    stand-ins and after hooks read moto's EC2 state around moto's action)."""
    from moto.ec2.responses import EC2Response

    original = EC2Response.call_action

    def call_action(self: Any) -> Any:
        with EC2_REQUESTS:
            return original(self)

    EC2Response.call_action = call_action  # type: ignore[method-assign]


def _serialize_sqs_receives() -> None:
    """SQS hands a message to one receiver at a time until its visibility timeout ends ("Amazon SQS visibility
    timeout", SQS developer guide) and moves one past its maxReceiveCount to the dead-letter queue once
    (SetQueueAttributes, RedrivePolicy); moto's `receive_message` walks the queue with no lock, so two receives on
    two request threads both took the same visible message, or both moved the same one to the dead-letter queue
    and the second failed with `list.remove(x): x not in list` (HTTP 500 to a Lambda poller; the chaos soak's 100
    Spot warnings met it). Each pass over a queue is taken one at a time here, a lock per queue; a long poll waits
    between passes outside the lock (moto's own wait, on the queue's condition), so a receiver waiting for messages
    holds up no other request, and the FIFO queue's poller, which passes again and again while its group is in
    flight (as moto's own loop does), holds up no other queue's."""
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    locks: dict[tuple[int, str], threading.Lock] = {}
    making = threading.Lock()
    original = SQSBackend.receive_message

    def receive_message(self: Any, queue_name: str, count: int, wait_seconds_timeout: int,
                        visibility_timeout: int, message_attribute_names: list[str] | None = None) -> Any:
        with making:
            lock = locks.setdefault((id(self), queue_name), threading.Lock())
        end = unix_time() + wait_seconds_timeout
        while True:
            with lock:
                found = original(self, queue_name, count, 0, visibility_timeout, message_attribute_names)
            left = end - unix_time()
            if found or left <= 0:
                return found
            self.get_queue(queue_name).wait_for_messages(min(1.0, left))

    SQSBackend.receive_message = receive_message  # type: ignore[method-assign]


def _retention_read_from_the_queue() -> None:
    """A receive checks each message it hands out against the queue's MessageRetentionPeriod; moto reads that
    through `get_queue_attributes`, which works out every attribute of the queue, ApproximateNumberOfMessages
    among them, by walking all its messages: a receive cost time in the square of the queue's length (350 ms for
    ten of 300 messages here), and every Lambda poller of the emulator pays it on every receive. The period is
    read from the queue itself; a message past it is still never handed out."""
    from moto.core.utils import unix_time
    from moto.sqs.models import SQSBackend

    def is_message_valid_based_on_retention_period(self: Any, queue_name: str, message: Any) -> bool:
        retention = int(self.get_queue(queue_name).message_retention_period)
        return bool(retention + message.sent_timestamp / 1000 > unix_time())

    SQSBackend.is_message_valid_based_on_retention_period = (  # type: ignore[method-assign]
        is_message_valid_based_on_retention_period)


def _transactions_without_table_copies() -> None:
    """DynamoDB's TransactWriteItems is all or nothing ("DynamoDB transactions"), at a cost that does not depend
    on the table's size. moto gets all or nothing by deep-copying every table the transaction names before it
    starts and putting the copy back if it fails: each transaction costs a copy of the whole table (tens of
    milliseconds at a few thousand items, under the lock every DynamoDB request takes here), so a load of
    conditional writes slowed with the table's size as DynamoDB never does.

    Here the items the transaction names are saved instead (each action names one item, and no two the same:
    TransactWriteItems API reference) and put back if it fails, the tables are left as they are. The outcome is
    moto's, item for item; only the copies go. Requests are served one at a time (`_serialize_dynamodb`), so
    nothing sees the items between a failed transaction's writes and their restoration.
    """
    import copy

    from moto.dynamodb import models
    from moto.dynamodb.models import DynamoDBBackend
    from moto.dynamodb.models.dynamo_type import DynamoType
    from moto.dynamodb.models.table import Table

    class _KeepTables:
        """`copy` as moto's transaction sees it: a table is not copied (its named items are saved instead)."""

        @staticmethod
        def deepcopy(value: Any, memo: Any = None) -> Any:
            return value if isinstance(value, Table) else copy.deepcopy(value, memo)

    original = DynamoDBBackend.transact_write_items

    def named_items(backend: Any, actions: list[dict[str, Any]]) -> list[tuple[Any, Any, Any, Any]]:
        saved = []
        for action in actions:
            op = next(iter(action.values()), None)
            if not isinstance(op, dict):
                continue
            table = backend.tables.get(op.get("TableName"))
            attributes = (op.get("Key") or op.get("Item") or {}) if table is not None else {}
            if table is None or table.hash_key_attr not in attributes:
                continue
            hash_value = DynamoType(attributes[table.hash_key_attr])
            range_value = None
            if table.range_key_attr is not None:
                if table.range_key_attr not in attributes:
                    continue
                range_value = DynamoType(attributes[table.range_key_attr])
            saved.append((table, hash_value, range_value, copy.deepcopy(table.get_item(hash_value, range_value))))
        return saved

    def put_back(saved: list[tuple[Any, Any, Any, Any]]) -> None:
        for table, hash_value, range_value, item in reversed(saved):
            if range_value is None:
                if item is None:
                    table.items.pop(hash_value, None)
                else:
                    table.items[hash_value] = item
            elif item is None:
                table.items[hash_value].pop(range_value, None)
            else:
                table.items[hash_value][range_value] = item

    def transact_write_items(self: Any, transact_items: list[dict[str, Any]]) -> None:
        saved = named_items(self, transact_items) if len(transact_items) <= 100 else []
        models.copy = _KeepTables  # type: ignore[assignment]
        try:
            original(self, transact_items)
        except Exception:
            put_back(saved)
            raise
        finally:
            models.copy = copy

    DynamoDBBackend.transact_write_items = transact_write_items  # type: ignore[method-assign]


def _unsupported(environ: dict[str, Any], start_response: Any, reason: str = "") -> list[bytes]:
    """The error response for a request the emulator cannot serve, in the request's protocol."""
    target = environ.get("HTTP_X_AMZ_TARGET", "")
    credential = environ.get("HTTP_AUTHORIZATION", "")
    service = credential.split("/")[3] if credential.count("/") >= 4 else environ.get("HTTP_HOST", "?")
    message = reason or f"the emulator (moto) has no {service} API"
    log.debug("emulator cannot serve %s %s: %s", service, target or environ.get("PATH_INFO", ""), message)
    if environ.get("CONTENT_TYPE", "").startswith("application/x-www-form-urlencoded"):  # query and EC2 protocols
        code = "InvalidAction"
        body = (f"<Response><Errors><Error><Code>{code}</Code><Message>{message}</Message></Error></Errors>"
                "<RequestID>emulator</RequestID></Response>")
        content_type = "text/xml"
    else:
        code = "UnknownOperationException"
        body = json.dumps({"__type": code, "message": message})
        content_type = "application/x-amz-json-1.1"
    start_response("400 Bad Request", [("Content-Type", content_type), ("x-amzn-ErrorType", code)])
    return [body.encode()]


def _instance_pages_that_survive_changes() -> None:
    """DescribeInstances' `NextToken` is opaque, and calling again with it until none comes back lists every
    match ("Pagination in the Amazon EC2 API", Amazon EC2 developer guide); nothing in EC2's documentation lets
    the call fail because the results changed between two pages. moto's token is the last reservation's id,
    looked up among the reservations that match the filters *now*: if that reservation's instance changed state
    in between (a drain terminating it while the garbage collector lists the running ones, 100 to a page), the
    lookup raises and the server answers HTTP 500. Here the next page starts after that reservation in moto's
    own order (the order of the listing, filtered or not), wherever its instance is now; a token that names no
    reservation at all is refused with moto's `InvalidNextToken`. Calls naming instance ids are moto's as before.
    """
    from moto.core.responses import ActionResult
    from moto.ec2.exceptions import InvalidNextToken
    from moto.ec2.responses.instances import InstanceResponse

    original = InstanceResponse.describe_instances

    def describe_instances(self: Any) -> Any:
        token = self._get_param("NextToken")
        if not token or self._get_param("InstanceIds", []):
            return original(self)
        self.error_on_dryrun()
        order = {reservation_id: n for n, reservation_id in enumerate(list(self.ec2_backend.reservations))}
        if token not in order:
            raise InvalidNextToken(token)
        matching = self.ec2_backend.describe_instances(filters=self._filters_from_querystring())
        after = [r for r in matching if order.get(r.id, len(order)) > order[token]]
        page = after[:int(self._get_param("MaxResults", 100))]
        return ActionResult({"Reservations": page, "NextToken": page[-1].id if len(after) > len(page) else None})

    InstanceResponse.describe_instances = describe_instances  # type: ignore[method-assign]
