"""The strict layer's wire formats: requests read back into boto3's shapes, errors that botocore parses as AWS's."""

from __future__ import annotations

import urllib.parse

import botocore.session
from botocore.parsers import create_parser
from botocore.serialize import create_serializer

from gpu_autoscaler.emulator.strict import wire

SESSION = botocore.session.get_session()


def round_trip(service: str, action: str, params: dict) -> dict:
    """Serialize as boto3 does, then read back as the strict layer does."""
    operation = SESSION.get_service_model(service).operation_model(action)
    body = create_serializer(operation.metadata["protocol"]).serialize_to_request(params, operation)["body"]
    encoded = urllib.parse.urlencode(body) if isinstance(body, dict) else body
    form = urllib.parse.parse_qsl(encoded if isinstance(encoded, str) else encoded.decode(), keep_blank_values=True)
    return wire.parse_params(operation.metadata["protocol"], operation, form,
                             encoded.encode() if isinstance(encoded, str) else encoded)


def test_ec2_requests_read_back_as_boto3_wrote_them() -> None:
    params = {
        "Type": "instant",
        "LaunchTemplateConfigs": [{
            "LaunchTemplateSpecification": {"LaunchTemplateId": "lt-1", "Version": "$Default"},
            "Overrides": [{"InstanceType": "p5.48xlarge", "SubnetId": "subnet-1", "Priority": 0.0,
                           "Placement": {"GroupName": "pg"},
                           "BlockDeviceMappings": [{"DeviceName": "/dev/xvdb",
                                                    "Ebs": {"VolumeSize": 500, "Encrypted": True}}]}],
        }],
        "TargetCapacitySpecification": {"TotalTargetCapacity": 2, "DefaultTargetCapacityType": "on-demand"},
        "OnDemandOptions": {"MinTargetCapacity": 2, "SingleAvailabilityZone": True},
        "TagSpecifications": [{"ResourceType": "instance", "Tags": [{"Key": "a", "Value": "b"}]}],
    }
    assert round_trip("ec2", "CreateFleet", params) == params


def test_query_protocol_lists_and_json_bodies() -> None:
    params = {"RoleName": "r", "PolicyArn": "arn:aws:iam::aws:policy/x"}
    assert round_trip("iam", "AttachRolePolicy", params) == params
    tags = {"RoleName": "r", "Tags": [{"Key": "a", "Value": "b"}, {"Key": "c", "Value": "d"}]}
    assert round_trip("iam", "TagRole", tags) == tags
    operation = SESSION.get_service_model("events").operation_model("PutRule")
    assert wire.parse_params("json", operation, [], b'{"Name": "x"}') == {"Name": "x"}


def test_errors_parse_as_aws_errors() -> None:
    for service, protocol in (("ec2", "ec2"), ("iam", "query"), ("events", "json")):
        status, headers, body = wire.error_response(protocol, "InvalidParameterValue", "exact words", 400)
        parsed = create_parser(protocol).parse(  # an error has no output shape: botocore takes None, the stubs do not
            {"body": body, "headers": dict(headers), "status_code": status}, None)  # type: ignore[arg-type]
        assert parsed["Error"]["Code"] == "InvalidParameterValue", service
        assert parsed["Error"]["Message"] == "exact words", service
