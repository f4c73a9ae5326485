"""The three patch formats the API server accepts for built-in types, as the `kubernetes` client sends them.

- JSON patch (RFC 6902): a list of operations — what a client sends when the body is a list;
- JSON merge patch (RFC 7386): maps merge, `null` deletes, lists replace;
- strategic merge patch: a merge patch whose lists of named things (containers, conditions, owner
  references…) merge by their key instead of being replaced, with the `$patch` directives. The client
  sends an object body this way (`cordon`: `{"spec": {"unschedulable": true}}`).

Which lists merge, and by what key, follows the `patchMergeKey` tags of the core types we serve; every other
list (node taints, tolerations) is replaced whole, as it is by a real API server.
"""

from __future__ import annotations

import copy
from typing import Any

from gpu_autoscaler.emulator.kube_objects import ApiError

__all__ = ["JSON_PATCH", "MERGE_PATCH", "STRATEGIC_MERGE_PATCH", "apply_patch"]

JSON_PATCH = "application/json-patch+json"
MERGE_PATCH = "application/merge-patch+json"
STRATEGIC_MERGE_PATCH = "application/strategic-merge-patch+json"

_MERGE_KEYS = {
    "containers": "name",
    "initContainers": "name",
    "ephemeralContainers": "name",
    "env": "name",
    "volumes": "name",
    "volumeMounts": "mountPath",
    "ports": "containerPort",
    "conditions": "type",
    "addresses": "type",
    "ownerReferences": "uid",
    "imagePullSecrets": "name",
    "hostAliases": "ip",
    "topologySpreadConstraints": "topologyKey",
}
_PRIMITIVE_MERGE = frozenset({"finalizers"})
"""Lists of strings that strategic merge unions instead of replacing."""


def apply_patch(document: dict[str, Any], patch: Any, content_type: str) -> dict[str, Any]:
    """The patched copy of `document`; a malformed patch is a 400, as on the API server."""
    kind = content_type.split(";", 1)[0].strip().lower()
    if kind == JSON_PATCH:
        if not isinstance(patch, list):
            raise ApiError.bad_request("json patch must be a list of operations")
        return _json_patch(copy.deepcopy(document), patch)
    if not isinstance(patch, dict):
        raise ApiError.bad_request("a merge patch must be a JSON object")
    if kind == MERGE_PATCH:
        return _merge(copy.deepcopy(document), patch)
    if kind == STRATEGIC_MERGE_PATCH:
        return _strategic(copy.deepcopy(document), patch)
    raise ApiError(415, "UnsupportedMediaType", f"the body of the request was in an unknown format - "
                   f"accepted media types include: {JSON_PATCH}, {MERGE_PATCH}, {STRATEGIC_MERGE_PATCH}")


# RFC 7386


def _merge(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if value is None:
            target.pop(key, None)
        else:
            target[key] = _merge(target.get(key), value)
    return target


# Strategic merge


def _strategic(target: Any, patch: Any) -> Any:
    if not isinstance(patch, dict):
        return copy.deepcopy(patch)
    if patch.get("$patch") == "replace":
        return {k: copy.deepcopy(v) for k, v in patch.items() if k != "$patch"}
    if patch.get("$patch") == "delete":
        return None
    if not isinstance(target, dict):
        target = {}
    for key, value in patch.items():
        if key.startswith("$"):  # $setElementOrder/…, $retainKeys: ordering and pruning hints
            continue
        if value is None:
            target.pop(key, None)
        elif isinstance(value, list) and key in _MERGE_KEYS and isinstance(target.get(key), list):
            target[key] = _merge_list(target[key], value, _MERGE_KEYS[key])
        elif isinstance(value, list) and key in _PRIMITIVE_MERGE and isinstance(target.get(key), list):
            target[key] = target[key] + [v for v in value if v not in target[key]]
        elif isinstance(value, dict):
            merged = _strategic(target.get(key), value)
            if merged is None:
                target.pop(key, None)
            else:
                target[key] = merged
        else:
            target[key] = copy.deepcopy(value)
    return target


def _merge_list(current: list[Any], patch: list[Any], merge_key: str) -> list[Any]:
    out = [copy.deepcopy(item) for item in current]
    if any(isinstance(item, dict) and item.get("$patch") == "replace" for item in patch):
        return [copy.deepcopy(i) for i in patch if not (isinstance(i, dict) and i.get("$patch") == "replace")]
    for item in patch:
        if not isinstance(item, dict) or merge_key not in item:
            raise ApiError.bad_request(f"map in a list merged by {merge_key!r} does not contain it: {item!r}")
        position = next((i for i, existing in enumerate(out) if existing.get(merge_key) == item[merge_key]), None)
        if item.get("$patch") == "delete":
            if position is not None:
                del out[position]
        elif position is None:
            out.append({k: copy.deepcopy(v) for k, v in item.items() if not k.startswith("$")})
        else:
            out[position] = _strategic(out[position], item)
    return out


# RFC 6902


def _json_patch(document: dict[str, Any], operations: list[Any]) -> dict[str, Any]:
    root: Any = document
    for operation in operations:
        if not isinstance(operation, dict) or "op" not in operation or "path" not in operation:
            raise ApiError.bad_request(f"invalid json patch operation: {operation!r}")
        op = operation["op"]
        path = _pointer(operation["path"])
        if op == "add":
            root = _add(root, path, copy.deepcopy(operation.get("value")))
        elif op == "remove":
            root, _ = _remove(root, path)
        elif op == "replace":
            root, _ = _remove(root, path)
            root = _add(root, path, copy.deepcopy(operation.get("value")))
        elif op in ("move", "copy"):
            source = _pointer(operation.get("from", ""))
            if op == "move":
                root, value = _remove(root, source)
            else:
                value = copy.deepcopy(_get(root, source))
            root = _add(root, path, value)
        elif op == "test":
            if _get(root, path) != operation.get("value"):
                raise ApiError(422, "Invalid", f"the server rejected our request due to an error in our request: "
                               f"testing value {operation['path']} failed")
        else:
            raise ApiError.bad_request(f"unknown json patch operation {op!r}")
    if not isinstance(root, dict):
        raise ApiError.bad_request("json patch replaced the whole object with a non-object")
    return root


def _pointer(text: str) -> list[str]:
    if text == "":
        return []
    if not text.startswith("/"):
        raise ApiError.bad_request(f"invalid json pointer {text!r}")
    return [part.replace("~1", "/").replace("~0", "~") for part in text[1:].split("/")]


def _get(root: Any, path: list[str]) -> Any:
    current = root
    for part in path:
        if isinstance(current, dict) and part in current:
            current = current[part]
        elif isinstance(current, list) and part.isdigit() and int(part) < len(current):
            current = current[int(part)]
        else:
            raise ApiError(422, "Invalid", f"path /{'/'.join(path)} does not exist")
    return current


def _add(root: Any, path: list[str], value: Any) -> Any:
    if not path:
        return value
    parent = _get(root, path[:-1])
    last = path[-1]
    if isinstance(parent, dict):
        parent[last] = value
    elif isinstance(parent, list):
        if last == "-":
            parent.append(value)
        elif last.isdigit() and int(last) <= len(parent):
            parent.insert(int(last), value)
        else:
            raise ApiError(422, "Invalid", f"index {last} out of range at /{'/'.join(path)}")
    else:
        raise ApiError(422, "Invalid", f"cannot add at /{'/'.join(path)}")
    return root


def _remove(root: Any, path: list[str]) -> tuple[Any, Any]:
    if not path:
        return None, root
    parent = _get(root, path[:-1])
    last = path[-1]
    if isinstance(parent, dict) and last in parent:
        return root, parent.pop(last)
    if isinstance(parent, list) and last.isdigit() and int(last) < len(parent):
        return root, parent.pop(int(last))
    raise ApiError(422, "Invalid", f"path /{'/'.join(path)} does not exist")
