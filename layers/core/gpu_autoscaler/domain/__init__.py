"""Decisions: plain models in, decisions out. Never imports boto3 or the Kubernetes client."""
