"""A stand-in for the account's instance metadata defaults, which moto lacks, and the launch rule they feed.

- **Account defaults.** EC2 API Reference, ModifyInstanceMetadataDefaults / GetInstanceMetadataDefaults: the
  account-level IMDS settings of one Region (`HttpTokens`, `HttpPutResponseHopLimit`, `HttpEndpoint`,
  `InstanceMetadataTags`); "To remove a parameter's account-level default setting, specify no-preference"
  (`-1` for the hop limit). ModifyInstanceMetadataDefaults answers `Return: true`; GetInstanceMetadataDefaults
  answers `AccountLevel` with the settings made. moto 5 has neither action.
- **Which setting a launch gets.** EC2 User Guide, "Order of precedence for instance metadata options"
  (configuring-instance-metadata-options.html#instance-metadata-options-order-of-precedence): the launch's own
  `MetadataOptions` (RunInstances), else its launch template's, else the account-level default, else EC2's
  default (`InstanceMetadataTags` disabled). CreateFleet overrides cannot carry metadata options, so a fleet's
  launches take their template's, else the account's.
- **Tags in instance metadata.** EC2 User Guide, "View tags for your EC2 instances using instance metadata"
  (work-with-tags-in-IMDS.html): "If you allow access to tags in instance metadata, instance tag keys are subject
  to specific restrictions. Non-compliance will result in failed launches for new instances": only letters,
  digits and `+ - = . , _ : @`, no spaces or `/`, not `.`, `..` or `_index`. EC2 answers such a launch with
  `InvalidParameterValue` and the message below (the documentation gives no code; EC2's words as CreateFleet
  reports them, quoted in aws/karpenter-provider-aws#1527 and #7012, where an account default of `enabled` failed
  every launch carrying `kubernetes.io/cluster/<name>`): RunInstances as a whole, an instant CreateFleet per
  override of each launch template config whose instances would carry such a key, in its `Errors` (as EC2 Fleet
  reports a launch it could not make: EC2 User Guide, "EC2 Fleet request types"). Only instance tags are
  concerned: volumes and the fleet itself do not show in instance metadata.
"""

from __future__ import annotations

import re
import threading
from typing import TYPE_CHECKING, Any

from gpu_autoscaler.emulator.strict.core import Answer, Refusal, answer, check, on_reset
from gpu_autoscaler.emulator.strict.ec2 import instant_fleet_refusing, launch_template_data, launch_template_specs
from gpu_autoscaler.emulator.strict.ec2_api_idempotency import create_fleet_once_per_token

if TYPE_CHECKING:
    from gpu_autoscaler.emulator.strict.core import AwsRequest

__all__ = ["INVALID_TAG_KEY_MESSAGE", "invalid_tag_key_message"]

_SETTINGS = ("HttpTokens", "HttpPutResponseHopLimit", "HttpEndpoint", "InstanceMetadataTags")
_NO_PREFERENCE = ("no-preference", -1, "-1")
_TAG_KEY = re.compile(r"[0-9a-zA-Z\-_+=,.@:]{1,255}")
_RESERVED_KEYS = frozenset({".", "..", "_index"})
INVALID_TAG_KEY_MESSAGE = (r"'{key}' is not a valid tag key. Tag keys must match pattern ([0-9a-zA-Z\\-_+=,.@:]"
                           r"{{1,255}}), and must not be a reserved name ('.', '..', '_index')")
"""EC2's message, word for word (its two backslashes included)."""

_lock = threading.Lock()
_defaults: dict[tuple[str, str], dict[str, Any]] = {}


@on_reset
def _forget() -> None:
    with _lock:
        _defaults.clear()


def invalid_tag_key_message(key: str) -> str:
    return INVALID_TAG_KEY_MESSAGE.format(key=key)


# ---- the account's defaults --------------------------------------------------------------------------------


@answer("ec2", "ModifyInstanceMetadataDefaults")
def _modify(request: AwsRequest) -> Answer:
    with _lock:
        settings = _defaults.setdefault((request.account, request.region), {})
        for name in _SETTINGS:
            value = request.params.get(name)
            if value is None:
                continue
            if value in _NO_PREFERENCE:
                settings.pop(name, None)
            else:
                settings[name] = value
    return Answer(result={"Return": True})


@answer("ec2", "GetInstanceMetadataDefaults")
def _get(request: AwsRequest) -> Answer:
    return Answer(result={"AccountLevel": dict(_account_defaults(request))})


def _account_defaults(request: AwsRequest) -> dict[str, Any]:
    with _lock:
        return dict(_defaults.get((request.account, request.region), {}))


# ---- launches with tags in instance metadata ---------------------------------------------------------------


def _tags_in_metadata(request: AwsRequest, data: dict[str, Any], own: dict[str, Any] | None = None) -> bool:
    """Whether the launch's instances show their tags in instance metadata (the order of precedence above)."""
    for options in (own or {}, data.get("MetadataOptions") or {}, _account_defaults(request)):
        if options.get("InstanceMetadataTags"):
            return options["InstanceMetadataTags"] == "enabled"
    return False


def _instance_tag_keys(*tag_specifications: list[dict[str, Any]]) -> list[str]:
    return [str(tag.get("Key", "")) for specs in tag_specifications for spec in specs or []
            if spec.get("ResourceType") == "instance" for tag in spec.get("Tags") or []]


def _invalid_key(keys: list[str]) -> str | None:
    return next((k for k in keys if k in _RESERVED_KEYS or not _TAG_KEY.fullmatch(k)), None)


@check("ec2", "RunInstances")
def _run_with_tags_in_metadata(request: AwsRequest) -> None:
    specs = launch_template_specs(request)
    data = launch_template_data(request, specs[0]) if specs else {}
    if not _tags_in_metadata(request, data, request.params.get("MetadataOptions")):
        return
    bad = _invalid_key(_instance_tag_keys(request.params.get("TagSpecifications") or [],
                                          data.get("TagSpecifications") or []))
    if bad is not None:
        raise Refusal("InvalidParameterValue", invalid_tag_key_message(bad))


@answer("ec2", "CreateFleet", behind=create_fleet_once_per_token)
def _instant_fleet_with_tags_in_metadata(request: AwsRequest) -> Answer | None:
    if request.params.get("Type") != "instant":
        return None
    asked = request.params.get("TagSpecifications") or []

    def refuse(override: dict[str, Any], data: dict[str, Any]) -> Refusal | None:
        bad = _invalid_key(_instance_tag_keys(asked, data.get("TagSpecifications") or [])) \
            if _tags_in_metadata(request, data) else None
        return None if bad is None else Refusal("InvalidParameterValue", invalid_tag_key_message(bad))

    return instant_fleet_refusing(_instant_fleet_with_tags_in_metadata, request, refuse)
