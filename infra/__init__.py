"""The CDK app of gpu-autoscaler: one construct per capability, composed by `stack.GpuAutoscalerStack`.

No business logic lives here; names come from `gpu_autoscaler.naming`, the configuration from cdk.json.
"""
