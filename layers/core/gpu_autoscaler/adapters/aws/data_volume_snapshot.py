"""Build a Bottlerocket data-volume EBS snapshot that holds container images, for a pool's `blockDeviceMappings`.

Bottlerocket keeps the OS on one volume and containerd's state on a second, the data volume (`/dev/xvdb`).
A node launched with that volume restored from a snapshot boots with the images already on disk, so a pod
of a 10 GB image starts without pulling it. The procedure (the one aws-samples/bottlerocket-images-cache
documents; written here from its steps):

1. Launch a Bottlerocket instance with a data volume of the wanted size; its user data turns the admin
   host container on (`settings.host-containers.admin.enabled`), and selects the SOCI snapshotter when the
   pool uses it: Bottlerocket deletes images on a boot whose snapshotter differs from the last one
   (bottlerocket.dev, settings.container-runtime.snapshotter), so the snapshot must be made with the pool's.
2. Wait until its SSM agent is online (`DescribeInstanceInformation`, PingStatus `Online`).
3. Pull each image through SSM Run Command (`AWS-RunShellScript`): `apiclient exec admin sheltie` reaches
   the host, where `ctr` pulls into containerd's `k8s.io` namespace (the one the kubelet's CRI reads),
   labelled as CRI-managed, with the pool's snapshotter. Private ECR images are pulled with a token from
   `ecr:GetAuthorizationToken` of the image's region, taken by the caller's credentials.
4. Stop the instance (the filesystem is flushed and quiet), snapshot the data volume, wait until the
   snapshot is `completed`.
5. Terminate the instance, whatever happened before (unless asked to keep it, to look at a failure).

The builder instance carries the cluster's ownership tag, as everything the project launches does (the stack
lets its roles terminate only what carries it, and so does the emulator's IAM stand-in), and
`gpu-autoscaler/snapshot-builder = <cluster>`, which the garbage collector skips: it is no node that lost its
claim.

Every AWS call goes through the boto3 clients given, so the procedure runs on the embedded moto up to what
moto can do: moto has no SSM inventory (`DescribeInstanceInformation`) and records Run Command invocations
as `Success` without running them, so on the emulator no image is pulled and the agent wait is the
caller's (`agent_online`).
"""

from __future__ import annotations

import base64
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from botocore.exceptions import ClientError

from gpu_autoscaler.models.images import ecr_region, parse_image_reference
from gpu_autoscaler.models.labels import TAG_SNAPSHOT_BUILDER, cluster_tags

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

    from gpu_autoscaler.adapters.aws.clients import AwsClients

__all__ = [
    "BUILDER_TAG",
    "DATA_DEVICE",
    "SnapshotError",
    "SnapshotRequest",
    "SnapshotResult",
    "build_data_volume_snapshot",
    "images_of",
    "pull_command",
]

logger = logging.getLogger(__name__)

BUILDER_TAG = TAG_SNAPSHOT_BUILDER
DATA_DEVICE = "/dev/xvdb"
"""Bottlerocket's data volume: containerd's images live here."""
OS_DEVICE = "/dev/xvda"
_COMMAND_DONE = {"Success", "Cancelled", "TimedOut", "Failed", "Cancelling"}


class SnapshotError(RuntimeError):
    """A step failed; the message names the step, and the builder instance has been terminated (or kept)."""


@dataclass(frozen=True)
class SnapshotRequest:
    cluster: str
    images: tuple[str, ...]
    ami: str
    """A Bottlerocket AMI (the pool's, so the data volume's layout matches)."""
    subnet_id: str
    security_group_ids: tuple[str, ...]
    instance_type: str = "m6i.2xlarge"
    """Pull speed is network and disk: a larger type pulls faster; it runs minutes only."""
    volume_gib: int = 100
    instance_profile: str | None = None
    """Needs AmazonSSMManagedInstanceCore (Run Command); ECR pulls use a token passed in."""
    soci: bool = False
    keep_instance: bool = False
    timeout: float = 3600.0
    """Seconds allowed per wait (agent online, each pull, stop, snapshot)."""


@dataclass
class SnapshotResult:
    snapshot_id: str
    volume_gib: int
    instance_id: str
    commands: list[str] = field(default_factory=list)
    """Run Command ids, one per image."""

    def block_device_mapping(self) -> dict[str, Any]:
        """The pool's `blockDeviceMappings` entry (Karpenter's EC2NodeClass shape) for the data volume."""
        return {"deviceName": DATA_DEVICE, "ebs": {"volumeSize": f"{self.volume_gib}Gi", "volumeType": "gp3",
                                                   "snapshotId": self.snapshot_id, "encrypted": True,
                                                   "deleteOnTermination": True}}


def builder_user_data(soci: bool) -> str:
    """Bottlerocket settings of the builder: the admin container (for `sheltie`), the pool's snapshotter."""
    lines = ["[settings.host-containers.admin]", "enabled = true"]
    if soci:
        lines += ["", "[settings.container-runtime]", 'snapshotter = "soci"']
    return "\n".join(lines) + "\n"


def pull_command(image: str, *, soci: bool, credentials: str | None = None) -> str:
    """The host-side pull of one image, run through the admin container. `image` must be a valid reference
    (checked: it goes into a shell command); `credentials` is `AWS:<token>` for private ECR."""
    parse_image_reference(image)
    parts = ["apiclient", "exec", "admin", "sheltie", "ctr", "--address", "/run/containerd/containerd.sock",
             "--namespace", "k8s.io", "images", "pull", "--label", "io.cri-containerd.image=managed"]
    if soci:
        parts += ["--snapshotter", "soci"]
    if credentials:
        parts += ["--user", credentials]
    return " ".join([*parts, image])


def ecr_credentials(clients: AwsClients, image: str) -> str | None:
    """`AWS:<token>` for a private ECR image, from GetAuthorizationToken in the image's region; else None."""
    region = ecr_region(parse_image_reference(image))
    if region is None:
        return None
    answer = clients.for_region(region).client("ecr").get_authorization_token()
    token = answer["authorizationData"][0]["authorizationToken"]
    return base64.b64decode(token).decode()


class _Builder:
    def __init__(self, clients: AwsClients, request: SnapshotRequest, *, sleep: Callable[[float], None],
                 clock: Callable[[], float], agent_online: Callable[[str], bool] | None,
                 progress: Callable[[str], None]) -> None:
        self.ec2 = clients.client("ec2")
        self.ssm = clients.client("ssm")
        self.clients = clients
        self.request = request
        self.sleep = sleep
        self.clock = clock
        self.agent_online = agent_online or self._ssm_online
        self.progress = progress

    def wait(self, what: str, done: Callable[[], bool]) -> None:
        deadline = self.clock() + self.request.timeout
        while not done():
            if self.clock() >= deadline:
                raise SnapshotError(f"timed out after {self.request.timeout:.0f} s waiting for {what}")
            self.sleep(5.0)

    def check_image(self) -> None:
        """The data-volume layout is Bottlerocket's: an image that does not say it is Bottlerocket is refused
        before anything is launched (every Bottlerocket AMI's name starts `bottlerocket-`)."""
        try:
            images = self.ec2.describe_images(ImageIds=[self.request.ami])["Images"]
        except ClientError as error:
            reason = error.response.get("Error", {}).get("Message", str(error))
            raise SnapshotError(f"{self.request.ami}: {reason}") from None
        if not images:
            raise SnapshotError(f"{self.request.ami}: no such image")
        text = f"{images[0].get('Name', '')} {images[0].get('Description', '')}"
        if "bottlerocket" not in text.lower():
            raise SnapshotError(f"{self.request.ami} ({images[0].get('Name', 'unnamed')}) is not a Bottlerocket AMI: "
                                "only Bottlerocket keeps images on a separate data volume")

    def launch(self) -> str:
        r = self.request
        tags = [{"Key": key, "Value": value} for key, value in cluster_tags(r.cluster).items()]
        tags += [{"Key": BUILDER_TAG, "Value": r.cluster}, {"Key": "Name", "Value": f"{r.cluster}/snapshot-builder"}]
        kwargs: dict[str, Any] = {
            "ImageId": r.ami, "InstanceType": r.instance_type, "MinCount": 1, "MaxCount": 1,
            "SubnetId": r.subnet_id, "SecurityGroupIds": list(r.security_group_ids),
            "UserData": builder_user_data(r.soci),
            "BlockDeviceMappings": [{"DeviceName": DATA_DEVICE, "Ebs": {
                "VolumeSize": r.volume_gib, "VolumeType": "gp3", "Encrypted": True, "DeleteOnTermination": True}}],
            # Said outright, not left to the account's default: its tag keys hold a `/`, which an account
            # default of tags in instance metadata would fail the launch for (`domain.launch_templates`).
            "MetadataOptions": {"HttpTokens": "required", "InstanceMetadataTags": "disabled"},
            "TagSpecifications": [{"ResourceType": "instance", "Tags": tags}, {"ResourceType": "volume", "Tags": tags}],
        }
        if r.instance_profile:
            kwargs["IamInstanceProfile"] = {"Name": r.instance_profile}
        instance_id: str = self.ec2.run_instances(**kwargs)["Instances"][0]["InstanceId"]
        self.progress(f"launched {instance_id} ({r.instance_type}, {r.ami}, data volume {r.volume_gib} GiB)")
        return instance_id

    def _state(self, instance_id: str) -> str:
        [reservation] = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return str(reservation["Instances"][0]["State"]["Name"])

    def _ssm_online(self, instance_id: str) -> bool:
        answer = self.ssm.describe_instance_information(Filters=[{"Key": "InstanceIds", "Values": [instance_id]}])
        return any(i.get("PingStatus") == "Online" for i in answer.get("InstanceInformationList", []))

    def pull(self, instance_id: str, image: str) -> str:
        command = pull_command(image, soci=self.request.soci, credentials=ecr_credentials(self.clients, image))
        sent = self.ssm.send_command(InstanceIds=[instance_id], DocumentName="AWS-RunShellScript",
                                     Comment=f"gpu-autoscaler snapshot: pull {image}"[:100],
                                     Parameters={"commands": [command]})
        command_id: str = sent["Command"]["CommandId"]
        status: dict[str, str] = {}

        def finished() -> bool:
            answer = self.ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
            status.update(state=answer["Status"], error=answer.get("StandardErrorContent", ""))
            return answer["Status"] in _COMMAND_DONE

        self.wait(f"the pull of {image}", finished)
        if status["state"] != "Success":
            raise SnapshotError(f"pulling {image} ended {status['state']}: {status['error'].strip()[:500]}")
        self.progress(f"pulled {image}")
        return command_id

    def snapshot(self, instance_id: str) -> str:
        self.ec2.stop_instances(InstanceIds=[instance_id])
        self.wait(f"{instance_id} to stop", lambda: self._state(instance_id) == "stopped")
        [reservation] = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        mappings = reservation["Instances"][0].get("BlockDeviceMappings", [])
        volume = next((m["Ebs"]["VolumeId"] for m in mappings if m["DeviceName"] == DATA_DEVICE), None)
        if volume is None:
            raise SnapshotError(f"{instance_id} has no data volume at {DATA_DEVICE}: "
                                f"is {self.request.ami} a Bottlerocket AMI?")
        r = self.request
        snapshot_id: str = self.ec2.create_snapshot(
            VolumeId=volume, Description=f"Bottlerocket data volume with {len(r.images)} image(s) for {r.cluster}",
            TagSpecifications=[{"ResourceType": "snapshot", "Tags": [
                {"Key": BUILDER_TAG, "Value": r.cluster},
                {"Key": "gpu-autoscaler/images", "Value": ",".join(r.images)[:256]},
            ]}],
        )["SnapshotId"]
        self.progress(f"snapshot {snapshot_id} of {volume} started")

        def completed() -> bool:
            [snapshot] = self.ec2.describe_snapshots(SnapshotIds=[snapshot_id])["Snapshots"]
            if snapshot["State"] == "error":
                raise SnapshotError(f"snapshot {snapshot_id} failed: {snapshot.get('StateMessage', '')}")
            return snapshot["State"] == "completed"

        self.wait(f"snapshot {snapshot_id}", completed)
        return snapshot_id


def build_data_volume_snapshot(
    clients: AwsClients,
    request: SnapshotRequest,
    *,
    sleep: Callable[[float], None] = time.sleep,
    clock: Callable[[], float] = time.monotonic,
    agent_online: Callable[[str], bool] | None = None,
    progress: Callable[[str], None] = logger.info,
) -> SnapshotResult:
    """Run the procedure above; raises `SnapshotError` naming the failed step. `agent_online(instance id)`
    replaces the SSM inventory check where there is none (the emulator)."""
    if not request.images:
        raise SnapshotError("no images to put on the data volume")
    for image in request.images:
        parse_image_reference(image)
    builder = _Builder(clients, request, sleep=sleep, clock=clock, agent_online=agent_online, progress=progress)
    builder.check_image()
    instance_id = builder.launch()
    try:
        builder.wait(f"{instance_id} to run", lambda: builder._state(instance_id) == "running")
        builder.wait(f"the SSM agent of {instance_id}", lambda: builder.agent_online(instance_id))
        commands = [builder.pull(instance_id, image) for image in request.images]
        snapshot_id = builder.snapshot(instance_id)
    finally:
        if not request.keep_instance:
            builder.ec2.terminate_instances(InstanceIds=[instance_id])
            progress(f"terminated {instance_id}")
    return SnapshotResult(snapshot_id, request.volume_gib, instance_id, commands)


def images_of(lines: Sequence[str]) -> tuple[str, ...]:
    """Image references from a file's lines: one a line, blank lines and `#` comments skipped."""
    return tuple(line.strip() for line in lines if line.strip() and not line.strip().startswith("#"))
