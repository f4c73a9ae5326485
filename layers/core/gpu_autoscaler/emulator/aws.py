"""The embedded AWS: moto in server mode on 127.0.0.1, holding what the stack would create,
behind the strict layer (`emulator.strict`) that refuses what AWS refuses.

Handlers, tests, `invoke`, the emulator and the demo all talk to it over real HTTP with real boto3
clients (`AWS_ENDPOINT_URL`), so nothing in the code under test knows it is not AWS.

moto keeps its state in module globals, so every server started in one process shares it: this
module allows one live embedded server per process and resets moto's state when it starts one.
To reach a server that is already running (this process or another), `EmbeddedAws.attach` it.
"""

from __future__ import annotations

import logging
import socket
import threading
import urllib.request
from typing import TYPE_CHECKING, Any

import boto3
import botocore.loaders
import botocore.session

from gpu_autoscaler.adapters.aws.clients import AwsClients
from gpu_autoscaler.emulator import moto_fixes
from gpu_autoscaler.emulator.resources import discover, provision, update_launch_templates
from gpu_autoscaler.naming import ResourceNames

if TYPE_CHECKING:
    from types import TracebackType

    from moto.server import ThreadedMotoServer

    from gpu_autoscaler.config import Config
    from gpu_autoscaler.emulator.resources import StackResources

__all__ = ["FUNCTIONS_GROUP", "KUBERNETES_FUNCTIONS", "TEST_CREDENTIALS", "EmbeddedAws", "EmulatorError"]

TEST_CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_SESSION_TOKEN": "testing"}
"""moto accepts any credentials; these keep a machine's real ones (if any) out of every request."""

KUBERNETES_FUNCTIONS = ("packer", "interruption", "drain", "consolidate")
"""The functions that call the Kubernetes API (prewarm and fleet make no request): the stack gives each one's role
an access entry in the group the shipped `agent/deploy/functions-rbac.yaml` binds."""
FUNCTIONS_GROUP = "gpu-autoscaler-functions"

_live_lock = threading.Lock()
_live: EmbeddedAws | None = None
_models = botocore.loaders.create_loader()
"""API models, parsed once per process: each new session would otherwise re-read the JSON (half a second)."""


class EmulatorError(RuntimeError):
    """The embedded AWS could not start or is not usable as asked."""


class EmbeddedAws:
    """moto in server mode with the stack's resources for one configuration.

    `EmbeddedAws(config)` starts a fresh server when entered (or on `start()`); `EmbeddedAws.attach(config,
    url)` uses one already running and finds its resources by the naming convention. Either way the
    object hands out the endpoint, boto3 clients pointed at it, and the Lambda environment.
    """

    def __init__(
        self,
        config: Config,
        *,
        port: int = 0,
        host: str = "127.0.0.1",
        visibility_timeout: int | None = None,
    ) -> None:
        """`port=0` picks a free port; `visibility_timeout` (seconds) overrides every work queue's, for fast retries."""
        self.config = config
        self.names = ResourceNames(config.cluster_name)
        self._host = host
        self._port = port
        self._visibility_timeout = visibility_timeout
        self._server: ThreadedMotoServer | None = None
        self._endpoint_url: str | None = None
        self._clients: AwsClients | None = None
        self._resources: StackResources | None = None
        self._owns_server = True
        self._credentials: dict[str, dict[str, str]] = {}
        self._credentials_lock = threading.Lock()

    @classmethod
    def attach(cls, config: Config, endpoint_url: str) -> EmbeddedAws:
        """An emulator already running at `endpoint_url`, its resources found from `config` alone."""
        self = cls(config)
        self._owns_server = False
        self._endpoint_url = endpoint_url.rstrip("/")
        self._clients = _clients(config.region, self._endpoint_url)
        self._resources = discover(self._clients, config)
        return self

    # ---- lifecycle -----------------------------------------------------------------------------------------

    def start(self) -> EmbeddedAws:
        global _live
        if not self._owns_server:
            return self
        if self._server is not None:
            raise EmulatorError("this embedded AWS is already started")
        with _live_lock:
            if _live is not None:
                raise EmulatorError(
                    f"an embedded AWS already runs in this process at {_live.endpoint_url}; "
                    "moto shares its state within a process, so attach to that one instead"
                )
            _live = self
        try:
            self._start_server()
            self._clients = _clients(self.config.region, self.endpoint_url)
            _register_images(self.config, self._clients)
            _register_reservations(self.config, self._clients)
            _register_owner(self.config, self._clients)
            self._resources = provision(self._clients, self.config, visibility_timeout=self._visibility_timeout)
            _register_access_entries(self.config, self._resources)
        except BaseException:
            self.stop()
            raise
        return self

    def update(self, config: Config) -> StackResources:
        """A `cdk deploy` of a changed configuration over this stack, as CloudFormation applies it: the new images
        resolve, the parameter holds the new configuration, and each launch template whose data changed gets a new
        version (`update_launch_templates`: its default stays at 1). The resources are found again, as the
        functions' environment then names them."""
        _register_images(config, self.clients)
        update_launch_templates(self.clients, config, self.resources)
        self.clients.client("ssm").put_parameter(Name=self.resources.config_parameter, Value=config.to_json(),
                                                 Type="String", Tier="Advanced", Overwrite=True)
        self.config = config
        self._resources = discover(self.clients, config)
        return self._resources

    def stop(self) -> None:
        global _live
        if not self._owns_server:
            return
        server, self._server = self._server, None
        if server is not None:
            server.stop()
        with _live_lock:
            if _live is self:
                _live = None

    def __enter__(self) -> EmbeddedAws:
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def _start_server(self) -> None:
        moto_fixes.apply()
        if self._port:
            # moto's server thread dies silently on a taken port and start() would wait forever: check first.
            try:
                socket.create_server((self._host, self._port)).close()
            except OSError as error:
                raise EmulatorError(f"cannot listen on {self._host}:{self._port}: {error.strerror}") from None
        werkzeug = logging.getLogger("werkzeug")
        if werkzeug.level == logging.NOTSET:
            werkzeug.setLevel(logging.WARNING)  # one access-log line per boto3 call otherwise
        self._server = _strict_moto_server()(ip_address=self._host, port=self._port, verbose=False)
        self._server.start()
        host, port = self._server.get_host_and_port()
        self._endpoint_url = f"http://{host}:{port}"
        # State left by an earlier server (or mock) in this process must not leak into this one. The first reset
        # imports every moto backend: seconds on a quiet core, more than 10 s at load 11 on 2 (a CI run beside
        # other work failed here), so the timeout only guards against a hang.
        request = urllib.request.Request(f"{self._endpoint_url}/moto-api/reset", method="POST")
        with urllib.request.urlopen(request, timeout=60) as response:
            response.read()

    # ---- what it hands out ---------------------------------------------------------------------------------

    @property
    def owns_server(self) -> bool:
        return self._owns_server

    @property
    def endpoint_url(self) -> str:
        if self._endpoint_url is None:
            raise EmulatorError("the embedded AWS is not started")
        return self._endpoint_url

    @property
    def clients(self) -> AwsClients:
        if self._clients is None:
            raise EmulatorError("the embedded AWS is not started")
        return self._clients

    @property
    def resources(self) -> StackResources:
        if self._resources is None:
            raise EmulatorError("the embedded AWS is not started")
        return self._resources

    @property
    def queue_urls(self) -> dict[str, str]:
        """Logical name → URL: `pending-pods`, `interruption`, `launch`, `drain`, each `<name>-dlq`, `scheduler-dlq`."""
        return dict(self.resources.queue_urls)

    def queue_url(self, logical: str) -> str:
        return self.resources.queue_url(logical)

    def queue_arn(self, logical: str) -> str:
        return self.resources.queue_arns[logical]

    @property
    def table_name(self) -> str:
        return self.resources.table_name

    @property
    def config_parameter(self) -> str:
        return self.resources.config_parameter

    @property
    def launch_template_id(self) -> str:
        template = self.resources.launch_template_id
        if template is None:
            raise EmulatorError(f"no launch template '{self.names.launch_template}' at {self.endpoint_url}")
        return template

    @property
    def subnet_ids(self) -> dict[str, str]:
        """Configuration subnet id → the emulator's subnet id."""
        return dict(self.resources.subnet_ids)

    @property
    def zone_subnets(self) -> dict[str, str]:
        """Availability zone → the emulator's subnet id."""
        return dict(self.resources.zone_subnets)

    @property
    def security_group_ids(self) -> dict[str, str]:
        """Configuration security group id → the emulator's."""
        return dict(self.resources.security_group_ids)

    def function_environment(self, function: str | None = None) -> dict[str, str]:
        """What a Lambda of the stack would find in its environment, pointed at this endpoint.

        With `function`, also the variables Lambda itself sets that our code reads (the function name,
        used by Powertools idempotency keys, and the execution role's credentials: AWS_ACCESS_KEY_ID,
        AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN, Lambda Developer Guide, "Defined runtime environment variables")
        and the per-function Powertools service name.
        """
        return {
            **self.resources.function_environment(function),
            "AWS_ENDPOINT_URL": self.endpoint_url,
            **(self._role_credentials(function) if function else TEST_CREDENTIALS),
        }

    def _role_credentials(self, function: str) -> dict[str, str]:
        """The function's role assumed as Lambda assumes it (the session named after the function), once per
        function; TEST_CREDENTIALS for a deployment whose roles the emulator did not make."""
        role = self.resources.function_roles.get(function)
        if role is None:
            return dict(TEST_CREDENTIALS)
        with self._credentials_lock:
            if function not in self._credentials:
                session = self.resources.function_environment(function)["AWS_LAMBDA_FUNCTION_NAME"]
                issued = self.clients.client("sts").assume_role(RoleArn=role, RoleSessionName=session)["Credentials"]
                self._credentials[function] = {"AWS_ACCESS_KEY_ID": issued["AccessKeyId"],
                                               "AWS_SECRET_ACCESS_KEY": issued["SecretAccessKey"],
                                               "AWS_SESSION_TOKEN": issued["SessionToken"]}
            return dict(self._credentials[function])

    def endpoints(self) -> dict[str, Any]:
        """Everything an outside client needs, for printing."""
        r = self.resources
        return {
            "awsEndpointUrl": self.endpoint_url,
            "region": r.region,
            "queues": dict(r.queue_urls),
            "table": r.table_name,
            "configParameter": r.config_parameter,
            "launchTemplateId": r.launch_template_id,
            "subnets": dict(r.zone_subnets),
            "securityGroups": dict(r.security_group_ids),
        }


def _strict_moto_server() -> type[ThreadedMotoServer]:
    """moto's threaded server with the strict layer wrapped around its application (`emulator.strict`)."""
    from moto.moto_server.werkzeug_app import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from moto.server import ThreadedMotoServer
    from werkzeug.serving import make_server

    from gpu_autoscaler.emulator.strict import StrictLayer

    class StrictMotoServer(ThreadedMotoServer):
        def _server_entry(self) -> None:
            app = StrictLayer(DomainDispatcherApplication(create_backend_app))
            self._server = make_server(self._ip_address, self._port, app, True, request_handler=MotoRequestHandler)
            self._server_ready_event.set()
            self._server.serve_forever()

    return StrictMotoServer


def _clients(region: str, endpoint_url: str) -> AwsClients:
    core = botocore.session.get_session()
    core.register_component("data_loader", _models)
    session = boto3.session.Session(
        botocore_session=core,
        aws_access_key_id=TEST_CREDENTIALS["AWS_ACCESS_KEY_ID"],
        aws_secret_access_key=TEST_CREDENTIALS["AWS_SECRET_ACCESS_KEY"],
        aws_session_token=TEST_CREDENTIALS["AWS_SESSION_TOKEN"],
        region_name=region,
    )
    return AwsClients(region, endpoint_url, session=session)


def _register_images(config: Config, clients: AwsClients) -> None:
    """Make the configuration's pinned AMI ids resolve in moto.

    EC2 has no API to create an image with a chosen id, and moto only knows its own; this server runs
    in this process, so the images are put into moto's EC2 backend directly, with the ids the
    configuration pins (DescribeImages, RunInstances and CreateFleet then all accept them).
    """
    from moto.ec2.models import ec2_backends
    from moto.ec2.models.amis import Ami

    account = clients.client("sts").get_caller_identity()["Account"]
    backend = ec2_backends[account][config.region]
    images = {"x86_64": config.ami.x86_64, **({"arm64": config.ami.arm64} if config.ami.arm64 else {})}
    for architecture, image_id in images.items():
        family = "al2023" if config.ami.family == "AL2023" else "bottlerocket"
        backend.amis[image_id] = Ami(
            backend,
            image_id,
            name=f"gpu-autoscaler-{family}-nvidia-{architecture}-{config.ami.version}",
            description=f"{config.ami.family} NVIDIA {architecture} {config.ami.version} (pinned in the configuration)",
            architecture=architecture,
            virtualization_type="hvm",
            root_device_type="ebs",
            root_device_name="/dev/xvda",
            owner_alias="amazon",
            boot_mode="uefi-preferred",
            region_name=config.region,
        )


def _register_owner(config: Config, clients: AwsClients) -> None:
    """The stack's functions may terminate only the cluster's instances (an IAM condition): the strict layer
    applies it for this cluster (`emulator.strict.ec2_instances`)."""
    from gpu_autoscaler.emulator.strict.ec2_instances import register_owner

    register_owner(clients.client("sts").get_caller_identity()["Account"], config.region, config.cluster_name)


def _register_access_entries(config: Config, resources: StackResources) -> None:
    """The access entries the stack creates for the functions that call Kubernetes: STANDARD, in the group the
    shipped RBAC binds (EKS User Guide, "Create access entries"), kept in the emulator's EKS state
    (`emulator.strict.eks_access_entries`: moto's EKS has no access entries)."""
    from gpu_autoscaler.emulator.strict.eks_access_entries import create_access_entry

    for function in KUBERNETES_FUNCTIONS:
        create_access_entry(config.cluster_name, resources.function_roles[function],
                            kubernetes_groups=(FUNCTIONS_GROUP,), type="STANDARD")


def _register_reservations(config: Config, clients: AwsClients) -> None:
    """The configuration's capacity reservations, where it says what they hold (instance type, zone, count):
    on AWS they pre-exist with those ids; here the strict layer's Capacity Reservations stand-in holds them."""
    from gpu_autoscaler.emulator.strict.ec2_capacity_reservations import Reservation, register_reservation

    account = clients.client("sts").get_caller_identity()["Account"]
    for pool in config.node_pools:
        for cr in pool.capacity_reservations:
            if cr.instance_type and cr.availability_zone:
                count = cr.instance_count if cr.instance_count is not None else 1
                register_reservation(Reservation(
                    id=cr.id, account=account, region=config.region, instance_type=cr.instance_type,
                    zone=cr.availability_zone, total=count, available=count, match="targeted", kind=cr.type,
                ))
