"""The wire formats the strict layer reads and writes, from botocore's own service models.

Requests: the EC2 and query protocols send form fields (`LaunchTemplateConfigs.1.Overrides.2.InstanceType`,
`Attributes.entry.1.key`), the JSON protocols a JSON body. `parse_params` turns either back into the
parameters as boto3 takes them, walking the operation's input shape (the inverse of botocore's
`serialize.EC2Serializer` / `QuerySerializer`), so rules read the documented names.

Answers: `error_response` renders an error as the service's protocol does (EC2's `<Response><Errors>`,
query's `<ErrorResponse>`, JSON's `__type`); `ec2_response` renders a stand-in's result for an EC2 action
through the output shape (`<ActionResponse><requestId/>…`, lists as `<item>`), which botocore then parses
as it parses AWS.
"""

from __future__ import annotations

import base64
import json
import urllib.parse
import uuid
from datetime import datetime
from functools import cache
from typing import TYPE_CHECKING, Any
from xml.sax.saxutils import escape

import botocore.session

if TYPE_CHECKING:
    from botocore.model import OperationModel, ServiceModel, Shape

__all__ = ["ec2_response", "error_response", "operation_model", "parse_params", "parse_response", "serialize",
           "service_model"]

_MODEL_NAMES = {"servicequotas": "service-quotas", "states": "stepfunctions", "execute-api": "apigateway"}
"""SigV4 signing names that differ from botocore's model names."""

Trie = dict[str, Any]


@cache
def service_model(signing_name: str) -> ServiceModel:
    return botocore.session.get_session().get_service_model(_MODEL_NAMES.get(signing_name, signing_name))


def operation_model(signing_name: str, action: str) -> OperationModel | None:
    model = service_model(signing_name)
    return model.operation_model(action) if action in model.operation_names else None


# ---- requests ----------------------------------------------------------------------------------------------


def parse_params(protocol: str, operation: OperationModel | None, form: list[tuple[str, str]],
                 body: bytes) -> dict[str, Any]:
    """The operation's parameters as boto3 takes them (`{}` when there are none, or no model to read)."""
    if protocol in ("json", "rest-json"):
        try:
            data = json.loads(body or b"{}")
        except ValueError:
            return {}
        return data if isinstance(data, dict) else {}
    if operation is None or operation.input_shape is None:
        return {}
    trie: Trie = {}
    for key, value in form:
        node = trie
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                child = node[part] = {"": child}
            node = child
        node[parts[-1]] = value
    parsed = _structure(trie, operation.input_shape, ec2=protocol == "ec2")
    return parsed if isinstance(parsed, dict) else {}


def _wire_name(shape: Shape, member: str, *, ec2: bool) -> str:
    serialization = shape.serialization
    if ec2:
        if "queryName" in serialization:
            return str(serialization["queryName"])
        if "name" in serialization:
            name = str(serialization["name"])
            return name[0].upper() + name[1:]
        return member
    return str(serialization.get("name", member))


def _value(node: Any, shape: Shape, *, ec2: bool) -> Any:
    kind = shape.type_name
    if kind == "structure":
        return _structure(node, shape, ec2=ec2) if isinstance(node, dict) else None
    if kind == "list":
        return _list(node, shape, ec2=ec2)
    if kind == "map":
        return _map(node, shape, ec2=ec2)
    if isinstance(node, dict):
        node = node.get("")
    if node is None:
        return None
    if kind == "boolean":
        return str(node).lower() == "true"
    if kind in ("integer", "long"):
        try:
            return int(node)
        except ValueError:
            return node
    if kind in ("float", "double"):
        try:
            return float(node)
        except ValueError:
            return node
    if kind == "blob":
        try:
            return base64.b64decode(node)
        except ValueError:
            return node
    return node


def _structure(node: Trie, shape: Shape, *, ec2: bool) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for member, member_shape in shape.members.items():  # type: ignore[attr-defined]
        wire = _wire_name(member_shape, member, ec2=ec2)
        if wire in node:
            value = _value(node[wire], member_shape, ec2=ec2)
            if value is not None:
                out[member] = value
    return out


def _indexed(node: Any) -> list[Any]:
    if not isinstance(node, dict):
        return [node]
    numbered = sorted((int(k), v) for k, v in node.items() if k.isdigit())
    return [v for _, v in numbered]


def _list(node: Any, shape: Shape, *, ec2: bool) -> list[Any]:
    member = shape.member  # type: ignore[attr-defined]
    if not ec2 and isinstance(node, dict) and not shape.serialization.get("flattened"):
        node = node.get(member.serialization.get("name", "member"), {})
    return [v for v in (_value(item, member, ec2=ec2) for item in _indexed(node)) if v is not None]


def _map(node: Any, shape: Shape, *, ec2: bool) -> dict[str, Any]:
    if not isinstance(node, dict):
        return {}
    key_name = shape.key.serialization.get("name", "key")  # type: ignore[attr-defined]
    value_name = shape.value.serialization.get("name", "value")  # type: ignore[attr-defined]
    entries = node if shape.serialization.get("flattened") else node.get("entry", {})
    out: dict[str, Any] = {}
    for entry in _indexed(entries):
        if isinstance(entry, dict) and key_name in entry:
            out[str(entry[key_name])] = _value(entry.get(value_name), shape.value, ec2=ec2)  # type: ignore[attr-defined]
    return out


# ---- answers -----------------------------------------------------------------------------------------------


def request_id() -> str:
    return str(uuid.uuid4())


def error_response(protocol: str, code: str, message: str, status: int,
                   json_version: str = "1.0") -> tuple[int, list[tuple[str, str]], bytes]:
    """(status, headers, body) of an error as the protocol carries it."""
    rid = request_id()
    if protocol == "ec2":
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{escape(code)}</Code>'
                f"<Message>{escape(message)}</Message></Error></Errors><RequestID>{rid}</RequestID></Response>")
        return status, [("Content-Type", "text/xml;charset=UTF-8")], body.encode()
    if protocol == "query":
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<ErrorResponse><Error><Type>Sender</Type>'
                f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
                f"<RequestId>{rid}</RequestId></ErrorResponse>")
        return status, [("Content-Type", "text/xml"), ("x-amzn-RequestId", rid)], body.encode()
    if protocol == "json":
        payload = json.dumps({"__type": code, "message": message}).encode()
        return status, [("Content-Type", f"application/x-amz-json-{json_version}"), ("x-amzn-RequestId", rid)], payload
    if protocol == "rest-json":
        payload = json.dumps({"message": message}).encode()
        return status, [("Content-Type", "application/json"), ("x-amzn-ErrorType", code),
                        ("x-amzn-RequestId", rid)], payload
    body = f"<Error><Code>{escape(code)}</Code><Message>{escape(message)}</Message><RequestId>{rid}</RequestId></Error>"
    return status, [("Content-Type", "application/xml")], body.encode()


def ec2_response(operation: OperationModel, result: dict[str, Any]) -> bytes:
    """An EC2 action's answer as EC2 sends it, `result` in the output shape's (boto3's) names."""
    name = operation.name
    inner = _xml_members(result, operation.output_shape) if operation.output_shape is not None else ""
    return (f'<?xml version="1.0" encoding="UTF-8"?>\n<{name}Response xmlns="http://ec2.amazonaws.com/doc/'
            f'2016-11-15/"><requestId>{request_id()}</requestId>{inner}</{name}Response>').encode()


def _xml_members(value: dict[str, Any], shape: Shape) -> str:
    parts = []
    for member, member_shape in shape.members.items():  # type: ignore[attr-defined]
        if member in value and value[member] is not None:
            tag = member_shape.serialization.get("name", member)
            parts.append(f"<{tag}>{_xml_value(value[member], member_shape)}</{tag}>")
    return "".join(parts)


def _xml_value(value: Any, shape: Shape) -> str:
    kind = shape.type_name
    if kind == "structure":
        return _xml_members(value, shape)
    if kind == "list":
        member = shape.member  # type: ignore[attr-defined]
        tag = member.serialization.get("name", "item")
        return "".join(f"<{tag}>{_xml_value(v, member)}</{tag}>" for v in value)
    if kind == "boolean":
        return "true" if value else "false"
    if kind == "timestamp" and isinstance(value, datetime):
        return value.strftime("%Y-%m-%dT%H:%M:%S.000Z")
    return escape(str(value))


def serialize(protocol: str, operation: OperationModel, params: dict[str, Any]) -> bytes:
    """A request body as botocore would send these parameters (for asking moto on a stand-in's behalf)."""
    from botocore.serialize import create_serializer

    request = create_serializer(protocol).serialize_to_request(params, operation)
    body = request["body"]
    if isinstance(body, dict):
        return urllib.parse.urlencode(body).encode()
    return body if isinstance(body, bytes) else str(body).encode()


def parse_response(protocol: str, operation: OperationModel, status: int, headers: list[tuple[str, str]],
                   payload: bytes) -> dict[str, Any]:
    """An answer as boto3 returns it (an `Error` key on a refusal)."""
    from botocore.parsers import create_parser

    shape = operation.output_shape if status < 300 else None
    parsed = create_parser(protocol).parse(
        {"body": payload, "headers": dict(headers), "status_code": status}, shape)  # type: ignore[arg-type]
    return dict(parsed)
