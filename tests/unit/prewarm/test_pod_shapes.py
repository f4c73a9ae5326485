"""Pod shape classes: the GPUs a pod asks for and the rung of the size ladder its CPU and memory per GPU need."""

from __future__ import annotations

from typing import Any

import pytest

from gpu_autoscaler.domain.pod_shapes import classes, placeholder_requests, shape_class, split_gpus, whole_pods
from gpu_autoscaler.models.resources import Resources

from .builders import make_config, make_pool

GIB = 1024**3


def pool(**overrides: Any) -> Any:
    return make_config(windows=[], pools=[make_pool(**overrides)]).node_pools[0]


WHOLE = pool()
SLICED = pool(gpuSharing={"mode": "time-slicing", "replicas": 4})


def requests(gpus: int, cpu: float, gib: float) -> dict[str, int]:
    return {"nvidia.com/gpu": gpus, "cpu": int(cpu * 1000), "memory": int(gib * GIB)}


@pytest.mark.parametrize("ask, cls", [
    (requests(1, 3, 12), "1d-t0"),     # fits a g4dn.xlarge's allocatable
    (requests(1, 4, 16), "1d-t1"),     # does not (4 vCPU less kubelet's share): a 2xlarge
    (requests(1, 12, 48), "1d-t2"),    # a 4xlarge
    (requests(1, 16, 48), "1d-t3"),    # more than a 4xlarge's allocatable vCPUs: an 8xlarge
    (requests(2, 8, 32), "2d-t1"),     # per GPU 4 vCPU and 16 GiB, as the 1-GPU pod above
    (requests(3, 3, 3), "4d-t0"),      # three GPUs are warmed for as four
    (requests(1, 200, 10), None),      # beyond the ladder
    (requests(16, 1, 1), None),        # more GPUs than any class
    ({"cpu": 1000}, None),             # no GPU
])
def test_classes_of_whole_gpu_pods(ask: dict[str, int], cls: str | None) -> None:
    assert shape_class(ask, WHOLE) == cls
    assert cls is None or cls in classes(WHOLE)


def test_a_time_sliced_device_is_a_share_of_a_gpu() -> None:
    # one device of four on a GPU: 3 vCPU per device is 12 per GPU, the 4xlarge rung
    assert shape_class(requests(1, 3, 5), SLICED) == "1d-t2"
    assert shape_class(Resources(requests(1, 3, 5)).as_dict(), SLICED) == "1d-t2"
    assert shape_class(requests(8, 1, 1), SLICED) is None  # more devices than the GPU has replicas
    assert classes(pool(gpuSharing={"mode": "mig", "migStrategy": "single", "migProfile": "1g.10gb"})) == []


def test_a_placeholder_asks_for_its_rung_so_every_pod_of_the_class_fits_where_it_fits() -> None:
    assert placeholder_requests("1d-t2", WHOLE) == {"nvidia.com/gpu": "1", "cpu": "14400m",
                                                    "memory": str(int(64 * GIB * 0.8))}
    assert placeholder_requests("2d-t0", WHOLE)["cpu"] == "7200m"
    assert placeholder_requests("1d-t2", SLICED) == {"nvidia.com/gpu": "1", "cpu": "3600m",
                                                     "memory": str(int(16 * GIB * 0.8))}
    for ask in (requests(1, 12, 48), requests(1, 14.4, 51.2)):
        need = placeholder_requests("1d-t2", WHOLE)
        assert ask["cpu"] <= int(need["cpu"][:-1]) and ask["memory"] <= int(need["memory"])


def test_gpus_are_split_into_whole_pods_in_proportion() -> None:
    assert split_gpus(8, [("1d-t2", 3.0), ("2d-t0", 1.0)], WHOLE) == [("1d-t2", 6), ("2d-t0", 1)]
    # a 4-GPU pod does not fit in 3 GPUs; the 1-GPU class gets its share and the largest remainder
    assert split_gpus(3, [("4d-t0", 1.0), ("1d-t0", 1.0)], WHOLE) == [("1d-t0", 2)]
    assert split_gpus(1, [("1d-t0", 1.0)], SLICED) == [("1d-t0", 4)]  # four devices of a quarter GPU
    assert split_gpus(0, [("1d-t0", 1.0)], WHOLE) == [] and split_gpus(4, [("1d-t0", 0.0)], WHOLE) == []


def test_forecasts_become_whole_pods_rounded_down() -> None:
    assert whole_pods({"1d-t2": 0.2, "2d-t0": 2.9, "4d-t1": 2.0, "8d-t0": 12.0}, WHOLE) == {
        "2d-t0": 2.0, "8d-t0": 8.0}
    assert whole_pods({"1d-t0": 0.1, "2d-t3": 0.25, "1d-t1": 0.75}, SLICED) == {"1d-t1": 0.75}  # 3 quarter-GPU pods
    assert whole_pods({"1d-t2": 0.1 * 3 / 0.3}, WHOLE) == {"1d-t2": 1.0}  # one pod, whatever the float arithmetic


def test_a_class_seen_on_the_same_weekday_alone_warms_no_node() -> None:
    # The forecast blends the weekday profile at 0.75 with the all-days one: one pod pending at this time on a past
    # same weekday, on too few of all past days to reach the quantile, forecasts 0.75 of a pod. 379 of the 617 warm
    # nodes of the default trace were bought on exactly that, and two thirds of them never held a pod.
    assert whole_pods({"1d-t2": 0.75, "1d-t3": 0.75}, WHOLE) == {}
    assert whole_pods({"2d-t3": 0.375}, SLICED) == {}  # 0.75 of a half-GPU pod
    assert whole_pods({"1d-t2": 1.0}, WHOLE) == {"1d-t2": 1.0}
