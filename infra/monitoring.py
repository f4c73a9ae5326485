"""Alarms on everything that means work was lost or failed, the topic they notify, and one dashboard of the
pipeline."""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING

from aws_cdk import Aws, Duration
from aws_cdk import aws_cloudwatch as cloudwatch
from aws_cdk import aws_cloudwatch_actions as actions
from aws_cdk import aws_iam as iam
from aws_cdk import aws_sns as sns
from aws_cdk import aws_sns_subscriptions as subscriptions
from constructs import Construct

from gpu_autoscaler.domain.agent_witness import AGENT_REPORTS_WITHIN
from gpu_autoscaler.wiring import FUNCTION_WIRING
from infra.queues import WorkQueue

if TYPE_CHECKING:
    from aws_cdk import aws_lambda as lambda_
    from aws_cdk import aws_sqs as sqs

    from gpu_autoscaler.naming import ResourceNames

__all__ = ["ALARM_EMAIL_CONTEXT", "Monitoring", "alarm_email"]

_PERIOD = Duration.minutes(1)
ALARM_EMAIL_CONTEXT = "gpu-autoscaler:alarmEmail"
"""CDK context: an address subscribed to the alarm topic (`cdk deploy -c gpu-autoscaler:alarmEmail=ops@example.com`);
a deploy setting, not part of the configuration the functions read."""
EVENT_POSTERS = ("packer", "drain")
"""The functions that post pod Events (`domain.pod_events`), and count those the API server refuses."""
OLDEST_MESSAGE_LIMITS = {WorkQueue.INTERRUPTION: Duration.seconds(60), WorkQueue.PENDING_PODS: Duration.minutes(3)}
"""How old the oldest message of a work queue may grow before an alarm says its function is not taking them (SQS's
ApproximateAgeOfOldestMessage, in-flight messages included). A Spot warning gives two minutes, so an interruption
waiting one is late; the agent reports each resync window (60 s), and the packer's single FIFO group holds every
report behind a failing one, so three windows mean capacity is planned for nobody. The launch and drain queues are
left out: a throttled CreateFleet goes back to its queue for a while, and a drain waits in its own by DelaySeconds."""


def alarm_email(scope: Construct) -> str | None:
    """The context's alarm address, if any; one that is no e-mail address fails the synth, naming the key."""
    value = scope.node.try_get_context(ALARM_EMAIL_CONTEXT)
    if value is None or value == "":
        return None
    if not isinstance(value, str) or "@" not in value.strip():
        raise ValueError(f"context {ALARM_EMAIL_CONTEXT}: {value!r} is not an e-mail address")
    return value.strip()


class Monitoring(Construct):
    """Any message in a DLQ, and any function error, is an alarm: both mean a decision did not happen. So is what a
    function counts that fails nothing yet needs an operator: pod Events the API server refuses, launches EC2
    refuses, nodes that never join, a Kubernetes API the ticks cannot reach; urgent work that waits in its queue;
    and GPU pods waiting while the agent sends nothing. Each alarm publishes to one topic when it fires and when it
    clears; the topic takes TLS only (aws:SecureTransport), and the context's alarm address, if given, is subscribed
    (SNS e-mails it a confirmation link first)."""

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        names: ResourceNames,
        region: str,
        functions: dict[str, lambda_.Function],
        queues: dict[str, sqs.Queue],
        dead_letter_queues: dict[str, sqs.Queue],
    ) -> None:
        super().__init__(scope, construct_id)
        # The alarm names carry the cluster (`names.alarm`); the display name (100 characters at most) need not.
        self.topic = sns.Topic(self, "AlarmTopic", display_name="gpu-autoscaler alarms", enforce_ssl=True)
        email = alarm_email(self)
        if email is not None:
            self.topic.add_subscription(subscriptions.EmailSubscription(email))
        self.alarms: dict[str, cloudwatch.Alarm] = {}
        for label, dlq in dead_letter_queues.items():
            self.alarms[f"dlq-{label}"] = self._above(
                f"{_camel(label)}DlqNotEmpty",
                alarm_name=names.alarm(f"{label}-dlq-not-empty"),
                alarm_description=f"Messages in the {label} dead-letter queue: look at them, fix, redrive.",
                metric=dlq.metric_approximate_number_of_messages_visible(period=_PERIOD, statistic="Maximum"),
            )
        for name, function in functions.items():
            self.alarms[f"errors-{name}"] = self._above(
                f"{_camel(name)}Errors",
                alarm_name=names.alarm(f"{name}-errors"),
                alarm_description=f"The {name} function failed (uncaught error or timeout).",
                metric=function.metric_errors(period=_PERIOD, statistic="Sum"),
            )
        own = functools.partial(_own_metric, names.metrics_namespace)
        for name in EVENT_POSTERS:
            # Events are best effort: a refused one (401, 403: no access entry or no RBAC binding) fails nothing, so
            # the Errors alarm never fires for it; the handlers count it (Powertools metrics, dimension `service`).
            self.alarms[f"events-refused-{name}"] = self._above(
                f"{_camel(name)}PodEventsRefused",
                alarm_name=names.alarm(f"{name}-pod-events-refused"),
                alarm_description=f"The Kubernetes API refused the {name} function's pod Events (401: no access "
                                  "entry; 403: agent/deploy/functions-rbac.yaml not applied).",
                metric=own("PodEventsRefused", name),
            )
        # A launch EC2 refuses for a reason no retry mends ends its claim with no Lambda error and no dead letter
        # (EC2 answers CreateFleet's refusals in `Errors`, and the record is handled): only the fleet's count says so.
        self.alarms["launches-refused"] = self._above(
            "FleetLaunchesRefused",
            alarm_name=names.alarm("fleet-launches-refused"),
            alarm_description="EC2 refused launches for a reason no retry mends (a permission such as iam:PassRole, "
                              "a parameter, the launch template, the Spot service-linked role, the EFA security "
                              "group): the fleet's log names the code; the pods stay pending until it is fixed.",
            metric=own("LaunchesRefused", "fleet"),
        )
        # A node that never registers or initializes is given up after `timeouts.registrationTtl` by a tick that
        # succeeds, and its pods are planned again onto a new instance with the same fate: one GPU instance billed
        # for nothing each time (Karpenter's NodePool says NodeRegistrationHealthy=False for the same).
        self.alarms["registration-timeouts"] = self._above(
            "ConsolidateRegistrationTimeouts",
            alarm_name=names.alarm("registration-timeouts"),
            alarm_description="A launched instance's node never registered or initialized within "
                              "timeouts.registrationTtl: terminated, its pods planned again onto a new one (node "
                              "role access entry, user data, security groups, GPU Operator?); the consolidate log "
                              "names the claim.",
            metric=own("RegistrationTimeouts", "consolidate"),
        )
        # A tick the Kubernetes API fails (unreachable, timing out, 5xx) ends normally: the next tick is the retry.
        # Five minutes running is no passing outage but an endpoint the function cannot reach (private only, or
        # publicAccessCidrs that leave Lambda's addresses out): nothing registers, consolidates or is collected.
        self.alarms["kubernetes-unreachable"] = self._above(
            "ConsolidateKubernetesUnreachable",
            alarm_name=names.alarm("kubernetes-unreachable"),
            alarm_description="The consolidate tick could not use the Kubernetes API five minutes running: no node "
                              "registers, is consolidated or collected (the endpoint's public access and its "
                              "publicAccessCidrs: gpu-autoscaler doctor); the consolidate log names the error.",
            metric=own("KubernetesUnreachable", "consolidate"),
            periods=5,
        )
        # A live claim's instance that EC2 still has without our ownership tag (re-tagged or untagged by someone) is
        # left alone by the garbage collector, and this cluster's roles can no longer end it (IAM's ResourceTag
        # condition): it runs and bills until the tag is put back (`domain.garbage_collection`).
        self.alarms["ownership-tag-lost"] = self._above(
            "ConsolidateOwnershipTagLost",
            alarm_name=names.alarm("ownership-tag-lost"),
            alarm_description="A live claim's instance no longer carries gpu-autoscaler/cluster=<cluster> (changed or "
                              "removed in EC2): its claim and node are left alone and this cluster cannot end it; "
                              "the consolidate log names the instance: put the tag back.",
            metric=own("OwnershipTagLost", "consolidate"),
        )
        # Messages no invocation takes (the function throttled, its event source mapping disabled or refused the
        # queue) or that wait behind a failing one in a FIFO group only age: their queue's metric says so long before
        # maxReceiveCount takes one to its DLQ. The metric is published every minute while the queue is active, and
        # not at all for an idle one, hence missing data as no breach ("Available CloudWatch metrics for Amazon SQS",
        # SQS developer guide).
        for kind, limit in OLDEST_MESSAGE_LIMITS.items():
            self.alarms[f"oldest-{kind.value}"] = self._above(
                f"{_camel(kind.value)}QueueOldestMessage",
                alarm_name=names.alarm(f"{kind.value}-queue-oldest-message"),
                alarm_description=f"A message has waited in the {kind.value} queue over {int(limit.to_seconds())} s: "
                                  f"its function is not taking them (throttled, event source mapping disabled, a "
                                  f"record failing ahead of them); see its log and RecordsFailed.",
                metric=queues[kind.value].metric_approximate_age_of_oldest_message(period=_PERIOD,
                                                                                   statistic="Maximum"),
                threshold=limit.to_seconds(),
            )
        # That metric leaves out a message received three times and not deleted (same page: a poison-pill message's
        # age is not counted), and a record the interruption function hands back is received three times within a
        # minute (`batch_failures.RETRY_AFTER`): its own count sees it. Two minutes running, so that one duplicate
        # notice found in progress once (it succeeds 10 s later) is no alarm.
        self.alarms["records-failed-interruption"] = self._above(
            "InterruptionRecordsFailed",
            alarm_name=names.alarm("interruption-records-failed"),
            alarm_description="The interruption function handed records back to its queue two minutes running: "
                              "a Spot warning gives two; its log names the error.",
            metric=own("RecordsFailed", "interruption"),
            periods=2,
        )
        # An agent not installed, crash-looping or refused by SQS sends nothing, and an empty queue publishes no
        # metrics once idle: a quiet cluster to every other alarm. The consolidate tick counts the GPU pods the agent
        # must have reported by now (`domain.agent_witness`); some, while nothing reached the pending-pods queue, two
        # periods running, is an agent that does not report. FILL takes the idle queue's missing NumberOfMessagesSent
        # as none (CloudWatch User Guide, "Using math expressions with CloudWatch metrics": FILL, IF).
        window = Duration.seconds(AGENT_REPORTS_WITHIN.total_seconds())
        self.alarms["agent-silent"] = self._above(
            "AgentSilent",
            alarm_name=names.alarm("agent-silent"),
            alarm_description="GPU pods have waited unschedulable for minutes and nothing reached the pending-pods "
                              "queue: the agent is not running or cannot send (kubectl -n gpu-autoscaler logs "
                              "deploy/gpu-autoscaler-agent; its Pod Identity association; the queue URL).",
            metric=cloudwatch.MathExpression(
                expression="IF(pods > 0 AND FILL(sent, 0) == 0, 1, 0)",
                using_metrics={
                    "pods": own("GpuPodsUnschedulable", "consolidate").with_(statistic="Maximum", period=window),
                    "sent": queues[WorkQueue.PENDING_PODS.value].metric_number_of_messages_sent(
                        statistic="Sum", period=window),
                },
                period=window,
            ),
            periods=2,
        )
        # A topic policy replaces SNS's default one (the account's principals may publish), so CloudWatch is let in
        # by name: for the alarms of this account and region named under the deployment's prefix (aws:SourceArn,
        # aws:SourceAccount against the confused deputy, as the Knowledge Center's "Why didn't I receive an SNS
        # notification for my CloudWatch alarm trigger?" writes it). The prefix, not the stack's alarms one by one:
        # an alarm an operator adds for this deployment (Throttles, say) publishes here too when named under it.
        self.topic.add_to_resource_policy(iam.PolicyStatement(
            principals=[iam.ServicePrincipal("cloudwatch.amazonaws.com")],
            actions=["sns:Publish"],
            resources=[self.topic.topic_arn],
            conditions={"ArnLike": {"aws:SourceArn": f"arn:{Aws.PARTITION}:cloudwatch:{Aws.REGION}:{Aws.ACCOUNT_ID}"
                                                     f":alarm:{names.alarm('*')}"},
                        "StringEquals": {"aws:SourceAccount": Aws.ACCOUNT_ID}},
        ))
        self.dashboard = cloudwatch.Dashboard(self, "Dashboard", dashboard_name=names.dashboard(region))
        fns = list(functions.items())
        self.dashboard.add_widgets(
            _graph("Invocations", [f.metric_invocations(label=n) for n, f in fns]),
            _graph("Errors", [f.metric_errors(label=n) for n, f in fns]),
            _graph("Throttles", [f.metric_throttles(label=n) for n, f in fns]),
            _graph("Duration p99 (ms)", [f.metric_duration(label=n, statistic="p99") for n, f in fns]),
        )
        work = list(queues.items())
        dead = list(dead_letter_queues.items())
        fed = [name for name in functions if FUNCTION_WIRING[name].queue is not None]
        self.dashboard.add_widgets(
            # The handlers' own count (Powertools metrics, dimension `service`): a partial batch failure is no
            # Lambda error, so this is the one sign of records going back to their queue before a DLQ has any.
            _graph("Records back to the queue", [own("RecordsFailed", name, label=name) for name in fed]),
            # Whether capacity flows at all; each failure by its reason, EC2's error code (not known in advance,
            # hence a search: CloudWatch User Guide, "CloudWatch search expression syntax"; the namespace quoted
            # for its "/" and "-").
            _graph("Launches", [
                own("ClaimsLaunched", "fleet", label="launched"),
                own("LaunchesRefused", "fleet", label="refused"),
                own("RegistrationTimeouts", "consolidate", label="never joined"),
                cloudwatch.SearchExpression(
                    expression=f"SEARCH('{{\"{names.metrics_namespace}\",reason,service}} "
                               f"MetricName=\"LaunchFailures\"', 'Sum', {int(_PERIOD.to_seconds())})",
                    label="failed", period=_PERIOD),
            ]),
        )
        self.dashboard.add_widgets(
            _graph("Queue depth", [q.metric_approximate_number_of_messages_visible(label=n) for n, q in work]),
            _graph("Oldest message (s)", [q.metric_approximate_age_of_oldest_message(label=n) for n, q in work]),
            _graph(
                "Dead-letter queues",
                [q.metric_approximate_number_of_messages_visible(label=n, statistic="Maximum") for n, q in dead],
            ),
            cloudwatch.AlarmStatusWidget(title="Alarms", alarms=list(self.alarms.values()), width=6),
        )

    def _above(
        self, construct_id: str, *, alarm_name: str, alarm_description: str, metric: cloudwatch.IMetric,
        threshold: float = 0, periods: int = 1,
    ) -> cloudwatch.Alarm:
        """Above `threshold` (by default: any at all) in `periods` periods running, one breaching minute unless said
        otherwise: every alarm here watches something that should not happen. Missing data is no breach: an idle
        queue publishes none, and a function publishes its counts only when it runs."""
        alarm = cloudwatch.Alarm(
            self,
            construct_id,
            alarm_name=alarm_name,
            alarm_description=alarm_description,
            metric=metric,
            threshold=threshold,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=periods,
            datapoints_to_alarm=periods if periods > 1 else None,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
        )
        notify = actions.SnsAction(self.topic)
        alarm.add_alarm_action(notify)
        alarm.add_ok_action(notify)
        return alarm


def _own_metric(namespace: str, name: str, service: str, *, label: str | None = None) -> cloudwatch.Metric:
    """A metric a handler publishes (Powertools metrics: the cluster's namespace, dimension `service`), summed."""
    return cloudwatch.Metric(namespace=namespace, metric_name=name, dimensions_map={"service": service},
                             statistic="Sum", period=_PERIOD, label=label)


def _graph(title: str, metrics: list[cloudwatch.IMetric]) -> cloudwatch.GraphWidget:
    return cloudwatch.GraphWidget(title=title, left=metrics, width=6, period=_PERIOD)


def _camel(label: str) -> str:
    return "".join(part.title() for part in label.split("-"))
