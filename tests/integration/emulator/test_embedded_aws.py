"""The embedded AWS creates what the stack would, and boto3 against its endpoint sees it."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

import boto3
import pytest
from aws_lambda_powertools.utilities.parser.models import SqsModel

from gpu_autoscaler.config import parse_config
from gpu_autoscaler.emulator.aws import EmbeddedAws, EmulatorError
from gpu_autoscaler.emulator.resources import MAX_RECEIVE_COUNT, ResourcesNotFound, discover, queue_specs
from gpu_autoscaler.emulator.sqs_events import RECEIVE_ARGUMENTS, sqs_event
from gpu_autoscaler.models.labels import TAG_CLAIM, TAG_CLUSTER, cluster_tags
from gpu_autoscaler.naming import ResourceNames
from gpu_autoscaler.settings import load_settings
from tests.conftest import example_config_data

if TYPE_CHECKING:
    from gpu_autoscaler.config import Config


def _attributes(aws: EmbeddedAws, logical: str) -> dict[str, str]:
    sqs = aws.clients.client("sqs")
    return sqs.get_queue_attributes(QueueUrl=aws.queue_url(logical), AttributeNames=["All"])["Attributes"]


def _tags(resource: dict[str, Any]) -> dict[str, str]:
    return {t["Key"]: t["Value"] for t in resource.get("Tags", [])}


def test_every_work_queue_redrives_to_its_own_dlq_after_five_receives(aws: EmbeddedAws) -> None:
    names = ResourceNames("ml-prod")
    for spec in queue_specs(names):
        attributes = _attributes(aws, spec.logical)
        dlq = _attributes(aws, spec.dlq_logical)
        assert aws.queue_url(spec.logical).endswith("/" + spec.name)
        assert aws.queue_url(spec.dlq_logical).endswith("/" + spec.dlq_name)
        redrive = json.loads(attributes["RedrivePolicy"])
        assert redrive == {"deadLetterTargetArn": dlq["QueueArn"], "maxReceiveCount": MAX_RECEIVE_COUNT}
        assert attributes["SqsManagedSseEnabled"] == dlq["SqsManagedSseEnabled"] == "true"
        assert attributes["VisibilityTimeout"] == str(spec.visibility_timeout)
        assert int(dlq["MessageRetentionPeriod"]) == 14 * 24 * 3600
        fifo = spec.logical == "pending-pods"
        assert (attributes.get("FifoQueue") == "true") is fifo
        assert (dlq.get("FifoQueue") == "true") is fifo
    assert names.pending_pods_queue.endswith(".fifo") and names.pending_pods_dlq.endswith(".fifo")
    assert aws.queue_url("scheduler-dlq").endswith("/" + names.scheduler_dlq)
    assert "RedrivePolicy" not in _attributes(aws, "scheduler-dlq")


def test_table_has_string_keys_ttl_and_point_in_time_recovery(aws: EmbeddedAws) -> None:
    dynamodb = aws.clients.client("dynamodb")
    table = dynamodb.describe_table(TableName=aws.table_name)["Table"]
    assert aws.table_name == ResourceNames("ml-prod").table
    assert {k["AttributeName"]: k["KeyType"] for k in table["KeySchema"]} == {"PK": "HASH", "SK": "RANGE"}
    assert {a["AttributeName"]: a["AttributeType"] for a in table["AttributeDefinitions"]} == {"PK": "S", "SK": "S"}
    assert table["BillingModeSummary"]["BillingMode"] == "PAY_PER_REQUEST"
    ttl = dynamodb.describe_time_to_live(TableName=aws.table_name)["TimeToLiveDescription"]
    assert (ttl["TimeToLiveStatus"], ttl["AttributeName"]) == ("ENABLED", "expiresAt")
    backups = dynamodb.describe_continuous_backups(TableName=aws.table_name)["ContinuousBackupsDescription"]
    assert backups["PointInTimeRecoveryDescription"]["PointInTimeRecoveryStatus"] == "ENABLED"


def test_config_parameter_holds_the_configuration_in_the_advanced_tier(
    aws: EmbeddedAws, example_config: Config
) -> None:
    ssm = aws.clients.client("ssm")
    value = ssm.get_parameter(Name=aws.config_parameter)["Parameter"]["Value"]
    assert parse_config(json.loads(value)) == example_config
    described = ssm.describe_parameters(ParameterFilters=[{"Key": "Name", "Values": [aws.config_parameter]}])
    assert described["Parameters"][0]["Tier"] == "Advanced"


def test_one_subnet_per_configured_zone_mapped_from_the_configured_ids(
    aws: EmbeddedAws, example_config: Config
) -> None:
    ec2 = aws.clients.client("ec2")
    assert set(aws.subnet_ids) == set(example_config.network.subnets.values())
    subnets = {s["SubnetId"]: s for s in ec2.describe_subnets(SubnetIds=list(aws.subnet_ids.values()))["Subnets"]}
    for zone, configured in example_config.network.subnets.items():
        subnet = subnets[aws.subnet_ids[configured]]
        assert aws.zone_subnets[zone] == subnet["SubnetId"]
        assert subnet["AvailabilityZone"] == zone
        assert subnet["VpcId"] == aws.resources.vpc_id
        assert _tags(subnet)[TAG_CLUSTER] == "ml-prod"
    groups = ec2.describe_security_groups(GroupIds=list(aws.security_group_ids.values()))["SecurityGroups"]
    assert set(aws.security_group_ids) == set(example_config.network.security_groups)
    assert all(g["VpcId"] == aws.resources.vpc_id for g in groups)


def test_node_role_from_the_configuration_and_its_instance_profile(aws: EmbeddedAws) -> None:
    iam = aws.clients.client("iam")
    role = iam.get_role(RoleName="ml-prod-gpu-node")["Role"]
    assert role["Arn"] == aws.resources.node_role_arn
    trust = role["AssumeRolePolicyDocument"]
    trust = json.loads(trust) if isinstance(trust, str) else trust
    assert trust["Statement"][0]["Principal"] == {"Service": "ec2.amazonaws.com"}
    name = ResourceNames("ml-prod").instance_profile("us-east-1")
    assert name == "ml-prod-gpu-autoscaler-us-east-1-node"
    profile = iam.get_instance_profile(InstanceProfileName=name)["InstanceProfile"]
    assert profile["Arn"] == aws.resources.instance_profile_arn
    assert [r["RoleName"] for r in profile["Roles"]] == ["ml-prod-gpu-node"]


def test_launch_template_pins_the_configured_ami(aws: EmbeddedAws, example_config: Config) -> None:
    ec2 = aws.clients.client("ec2")
    version = ec2.describe_launch_template_versions(LaunchTemplateId=aws.launch_template_id)[
        "LaunchTemplateVersions"
    ][0]
    assert version["LaunchTemplateName"] == ResourceNames("ml-prod").launch_template
    data = version["LaunchTemplateData"]
    assert data["ImageId"] == example_config.ami.x86_64
    assert data["IamInstanceProfile"] == {"Arn": aws.resources.instance_profile_arn}
    assert data["SecurityGroupIds"] == list(aws.security_group_ids.values())
    metadata = data["MetadataOptions"]
    assert (metadata["HttpTokens"], metadata["HttpPutResponseHopLimit"]) == ("required", 1)
    [root] = data["BlockDeviceMappings"]
    assert root["Ebs"]["Encrypted"] and root["Ebs"]["VolumeType"] == "gp3"
    images = ec2.describe_images(ImageIds=[example_config.ami.x86_64, example_config.ami.arm64])["Images"]
    assert {i["ImageId"]: i["Architecture"] for i in images} == {
        example_config.ami.x86_64: "x86_64", example_config.ami.arm64: "arm64"
    }


def test_create_fleet_instant_launches_from_the_template_into_the_override_subnet(
    aws: EmbeddedAws, example_config: Config
) -> None:
    ec2 = aws.clients.client("ec2")
    tags = {TAG_CLUSTER: "ml-prod", TAG_CLAIM: "gpu-burst-m4t9z", "Name": "ml-prod/gpu-burst-m4t9z"}
    for capacity_type, zone in (("spot", "us-east-1b"), ("on-demand", "us-east-1c")):
        response = ec2.create_fleet(
            Type="instant",
            LaunchTemplateConfigs=[{
                "LaunchTemplateSpecification": {"LaunchTemplateId": aws.launch_template_id, "Version": "$Latest"},
                "Overrides": [
                    {"InstanceType": "g6.xlarge", "SubnetId": aws.zone_subnets[zone], "Priority": 0.0},
                    {"InstanceType": "g5.xlarge", "SubnetId": aws.zone_subnets["us-east-1a"], "Priority": 1.0},
                ],
            }],
            TargetCapacitySpecification={"TotalTargetCapacity": 1, "DefaultTargetCapacityType": capacity_type},
            SpotOptions={"AllocationStrategy": "price-capacity-optimized"},
            OnDemandOptions={"AllocationStrategy": "prioritized"},
            TagSpecifications=[{"ResourceType": "instance", "Tags": [{"Key": k, "Value": v} for k, v in tags.items()]}],
        )
        assert not response.get("Errors")
        [launched] = response["Instances"]
        assert launched["Lifecycle"] == capacity_type
        instance = ec2.describe_instances(InstanceIds=launched["InstanceIds"])["Reservations"][0]["Instances"][0]
        assert instance["InstanceType"] == "g6.xlarge"
        assert instance["SubnetId"] == aws.zone_subnets[zone]
        assert instance["Placement"]["AvailabilityZone"] == zone
        assert instance["ImageId"] == example_config.ami.x86_64
        assert _tags(instance) == {**cluster_tags("ml-prod"), **tags}  # the template's with the request's


@pytest.mark.parametrize("logical", ["pending-pods", "launch"])
def test_a_message_received_more_than_max_receive_count_times_moves_to_the_dlq(aws: EmbeddedAws, logical: str) -> None:
    sqs = aws.clients.client("sqs")
    url = aws.queue_url(logical)
    fifo = {"MessageGroupId": "ml-prod", "MessageDeduplicationId": "poison-1"} if logical == "pending-pods" else {}
    sqs.send_message(QueueUrl=url, MessageBody='{"not": "a valid message"}', **fifo)
    for attempt in range(1, MAX_RECEIVE_COUNT + 1):
        # Never deleted, visible again at once: each receive is one failed delivery.
        [message] = sqs.receive_message(QueueUrl=url, VisibilityTimeout=0, **RECEIVE_ARGUMENTS)["Messages"]
        assert message["Attributes"]["ApproximateReceiveCount"] == str(attempt)
    assert sqs.receive_message(QueueUrl=url, VisibilityTimeout=0).get("Messages", []) == []
    [dead] = sqs.receive_message(QueueUrl=aws.queue_url(logical + "-dlq"), **RECEIVE_ARGUMENTS)["Messages"]
    assert dead["Body"] == '{"not": "a valid message"}'
    sqs.delete_message(QueueUrl=aws.queue_url(logical + "-dlq"), ReceiptHandle=dead["ReceiptHandle"])


def test_received_messages_become_the_lambda_sqs_event(aws: EmbeddedAws) -> None:
    sqs = aws.clients.client("sqs")
    url = aws.queue_url("pending-pods")
    sqs.send_message(
        QueueUrl=url, MessageBody='{"schemaVersion":1}', MessageGroupId="ml-prod", MessageDeduplicationId="d-1",
        MessageAttributes={"agentVersion": {"DataType": "String", "StringValue": "0.1.0"}},
    )
    messages = sqs.receive_message(QueueUrl=url, **RECEIVE_ARGUMENTS)["Messages"]
    event = sqs_event(messages, aws.queue_arn("pending-pods"))
    parsed = SqsModel.model_validate(event)
    [record] = event["Records"]
    assert record["body"] == '{"schemaVersion":1}'
    assert record["attributes"]["MessageGroupId"] == "ml-prod"
    assert record["attributes"]["MessageDeduplicationId"] == "d-1"
    assert record["messageAttributes"]["agentVersion"]["stringValue"] == "0.1.0"
    assert parsed.Records[0].eventSourceARN.endswith(":" + ResourceNames("ml-prod").pending_pods_queue)
    sqs.delete_message(QueueUrl=url, ReceiptHandle=record["receiptHandle"])


def test_function_environment_is_what_the_settings_model_reads(aws: EmbeddedAws) -> None:
    environment = aws.function_environment("fleet")
    settings = load_settings(environment)
    assert settings.table_name == aws.table_name
    assert settings.config_parameter == aws.config_parameter
    assert settings.launch_queue_url == aws.queue_url("launch")
    assert settings.drain_queue_url == aws.queue_url("drain")
    assert settings.launch_template_id == aws.launch_template_id
    assert settings.endpoint_url == aws.endpoint_url
    assert settings.region == "us-east-1"
    assert environment["AWS_LAMBDA_FUNCTION_NAME"] == ResourceNames("ml-prod").function("fleet")
    assert environment["POWERTOOLS_SERVICE_NAME"] == "fleet"
    assert environment["POWERTOOLS_METRICS_NAMESPACE"]
    assert environment["AWS_ACCESS_KEY_ID"] and environment["AWS_SECRET_ACCESS_KEY"]


def test_each_function_runs_with_its_own_roles_credentials_as_lambda_gives_them(aws: EmbeddedAws) -> None:
    environment = aws.function_environment("drain")
    sts = boto3.client("sts", region_name="us-east-1", endpoint_url=aws.endpoint_url,
                       aws_access_key_id=environment["AWS_ACCESS_KEY_ID"],
                       aws_secret_access_key=environment["AWS_SECRET_ACCESS_KEY"],
                       aws_session_token=environment["AWS_SESSION_TOKEN"])
    role = aws.resources.function_roles["drain"].rsplit("/", 1)[1]
    assert sts.get_caller_identity()["Arn"] == (
        f"arn:aws:sts::123456789012:assumed-role/{role}/{environment['AWS_LAMBDA_FUNCTION_NAME']}")


def test_attach_finds_the_same_resources_by_the_naming_convention(aws: EmbeddedAws, example_config: Config) -> None:
    attached = EmbeddedAws.attach(example_config, aws.endpoint_url + "/")
    assert not attached.owns_server
    assert attached.endpoint_url == aws.endpoint_url
    assert attached.resources == aws.resources
    credentials = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
    found, made = attached.function_environment("packer"), aws.function_environment("packer")
    assert {k: v for k, v in found.items() if k not in credentials} == {
        k: v for k, v in made.items() if k not in credentials}
    attached.stop()  # attaching never stops the server it found
    assert aws.clients.client("sqs").get_queue_url(QueueName=ResourceNames("ml-prod").launch_queue)


def test_attach_names_what_is_missing_for_another_cluster(aws: EmbeddedAws) -> None:
    data = example_config_data()
    data["clusterName"] = "ml-staging"
    with pytest.raises(ResourcesNotFound, match="ml-staging-gpu-autoscaler"):
        EmbeddedAws.attach(parse_config(data), aws.endpoint_url)


def test_a_second_embedded_server_in_the_same_process_is_refused(aws: EmbeddedAws, example_config: Config) -> None:
    with pytest.raises(EmulatorError, match="attach to that one"):
        EmbeddedAws(example_config).start()
    assert aws.clients.client("sqs").list_queues()["QueueUrls"]


def test_discover_keeps_configured_network_ids_that_have_no_stand_in(aws: EmbeddedAws) -> None:
    # A real deployment: the configuration names subnets and groups that exist as they are.
    data = example_config_data()
    data["network"] = {"subnets": aws.zone_subnets, "securityGroups": list(aws.security_group_ids.values())}
    resources = discover(aws.clients, parse_config(data))
    assert resources.subnet_ids == {s: s for s in aws.zone_subnets.values()}
    assert resources.zone_subnets == aws.zone_subnets
    assert resources.security_group_ids == {g: g for g in aws.security_group_ids.values()}
    assert resources.queue_urls == aws.queue_urls
