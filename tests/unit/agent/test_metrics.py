from __future__ import annotations

from gpu_autoscaler_agent.health import Metrics


def test_metrics_render_in_prometheus_text_format() -> None:
    metrics = Metrics()
    metrics.inc("pods_sent_total", 3)
    metrics.inc("send_failures_total", reason="throttled")
    metrics.set("lag_seconds", 0.5)
    metrics.observe("report_latency_seconds", 0.25)
    metrics.observe("report_latency_seconds", 0.75)
    text = metrics.render()
    assert "# TYPE gpu_autoscaler_agent_pods_sent_total counter\ngpu_autoscaler_agent_pods_sent_total 3\n" in text
    assert 'gpu_autoscaler_agent_send_failures_total{reason="throttled"} 1\n' in text
    assert "gpu_autoscaler_agent_lag_seconds 0.5\n" in text
    assert "gpu_autoscaler_agent_report_latency_seconds_sum 1\n" in text
    assert "gpu_autoscaler_agent_report_latency_seconds_count 2\n" in text
    assert "gpu_autoscaler_agent_pods_seen_total 0\n" in text  # every family shows, zero until counted


def test_label_values_are_escaped() -> None:
    metrics = Metrics()
    metrics.inc("watch_restarts_total", reason='a"b')
    assert 'reason="a\\"b"' in metrics.render()
