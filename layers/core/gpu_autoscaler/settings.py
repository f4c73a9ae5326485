"""The Lambdas' environment, validated once at cold start; logic never reads os.environ."""

from __future__ import annotations

import json
import os

from pydantic import BaseModel, ConfigDict, Field, field_validator

__all__ = ["FunctionSettings", "LaunchTemplateVersion", "load_settings"]


class LaunchTemplateVersion(BaseModel):
    """A launch template and the version launches ask: its `LatestVersionNumber` as the stack last wrote it (a
    number in a string, as CloudFormation's `Fn::GetAtt` gives it), never `$Default`, which a stack update does not
    move (infra/nodes.py)."""

    model_config = ConfigDict(frozen=True)

    id: str
    version: str


class FunctionSettings(BaseModel):
    model_config = ConfigDict(frozen=True, populate_by_name=True)

    table_name: str = Field(alias="TABLE_NAME")
    config_parameter: str = Field(alias="CONFIG_PARAMETER")
    """SSM parameter holding the configuration JSON (advanced tier: it can exceed 4 KB)."""
    config_digest: str | None = Field(default=None, alias="CONFIG_DIGEST")
    """`config.config_digest` of the parameter's value at deploy time (absent where no stack set it: the emulator)."""
    launch_queue_url: str | None = Field(default=None, alias="LAUNCH_QUEUE_URL")
    drain_queue_url: str | None = Field(default=None, alias="DRAIN_QUEUE_URL")
    launch_template_id: str | None = Field(default=None, alias="LAUNCH_TEMPLATE_ID")
    """The stack's On-Demand node launch template (pinned AMI, IMDSv2, encrypted EBS); given to the fleet function."""
    launch_templates: dict[str, LaunchTemplateVersion] = Field(default_factory=dict, alias="LAUNCH_TEMPLATES")
    """Template key → `{"id", "version"}`, as JSON (`domain.launch_templates`: one per capacity type and EFA count);
    a capacity type missing here launches from `LAUNCH_TEMPLATE_ID`."""
    pending_pods_dlq_url: str | None = Field(default=None, alias="PENDING_PODS_DLQ_URL")
    """Given to the packer: a document that can never parse goes there at once (`adapters.aws.dead_letters`)."""
    region: str = Field(default="us-east-1", alias="AWS_REGION")
    endpoint_url: str | None = Field(default=None, alias="AWS_ENDPOINT_URL")


    placement_groups: dict[str, str] = Field(default_factory=dict, alias="PLACEMENT_GROUPS")
    """`pool/zone` → cluster placement group of an EFA pool, as JSON."""
    @field_validator("launch_templates", "placement_groups", mode="before")
    @classmethod
    def _json(cls, value: object) -> object:
        return json.loads(value) if isinstance(value, str) else value


def load_settings(environ: dict[str, str] | None = None) -> FunctionSettings:
    env = dict(os.environ if environ is None else environ)
    return FunctionSettings.model_validate({k: v for k, v in env.items() if k in _NAMES})


_NAMES = {f.alias for f in FunctionSettings.model_fields.values() if f.alias}
