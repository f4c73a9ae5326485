"""Reading traces: the Alibaba CSV's semantics, the GPU-model mapping, and our own small format."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from gpu_autoscaler.simulation.trace import GPU_MODELS, TraceError, read_trace
from tests.unit.simulation.builders import write_alibaba

if TYPE_CHECKING:
    from pathlib import Path


def test_alibaba_rows_become_gpu_pods_with_the_traces_timing(tmp_path: Path) -> None:
    path = write_alibaba(tmp_path / "pods.csv", [
        "openb-pod-0001,6000,12288,1,460,,LS,Running,100,4100,160",
        "openb-pod-0002,20000,65536,0,0,,LS,Running,50,900,50",
        "openb-pod-0003,12000,16384,1,1000,V100M16|V100M32,BE,Pending,200,500,",
        "openb-pod-0004,96000,737280,8,1000,G2|T4,LS,Failed,10,40,12",
    ])
    trace = read_trace(path)
    assert [p.name for p in trace.pods] == ["openb-pod-0004", "openb-pod-0001", "openb-pod-0003"]
    big, shared, never = trace.pods
    assert (big.gpus, big.gpu_milli, big.duration, big.deleted_at, big.gpu_names) == (8, 1000, 28.0, None, ())
    assert shared.fractional and shared.share == pytest.approx(0.46)
    assert (shared.arrival, shared.duration) == (100.0, 4100.0 - 160.0)
    assert (never.duration, never.deleted_at, never.gpu_names) == (None, 500.0, ("v100",))
    assert trace.skipped == {"no GPU requested (not a GPU pod)": 1}
    assert trace.gpu_models == {"V100M16": 1, "V100M32": 1, "G2": 1}


def test_the_gpu_mapping_is_stated_with_the_catalogs_types(tmp_path: Path) -> None:
    from tests.unit.simulation.builders import make_catalog

    path = write_alibaba(tmp_path / "pods.csv", ["a,4000,8192,1,1000,T4,LS,Running,0,10,0",
                                                 "b,4000,8192,1,1000,X9,LS,Running,0,10,0"])
    trace = read_trace(path)
    mapping = trace.mapping(make_catalog())
    assert mapping["T4"] == {"gpuNames": ["t4"], "note": GPU_MODELS["T4"].note, "pods": 1,
                             "instanceTypes": ["g4dn.12xlarge", "g4dn.xlarge"]}
    assert mapping["G1"]["gpuNames"] == "any"
    assert mapping["X9"]["pods"] == 1 and "dropped" in mapping["X9"]["note"]
    assert trace.pods[1].gpu_names == ()


def test_our_csv_format_takes_fractions_gangs_and_quantities(tmp_path: Path) -> None:
    path = tmp_path / "mine.csv"
    path.write_text("name,arrival,duration,gpus,cpu,memory,gpu_name,gang,gang_size,deleted_at\n"
                    "w0,0,3600,8,64,600Gi,,train,2,\n"
                    "w1,0,3600,8,64,600Gi,,train,2,\n"
                    "infer,30,,0.25,500m,2Gi,t4|a10g,,,900\n")
    trace = read_trace(path, "csv")
    w0, _, infer = trace.pods
    assert (w0.gpus, w0.cpu_milli, w0.memory_mib, w0.gang, w0.gang_size) == (8, 64000, 600 * 1024, "train", 2)
    assert (infer.gpus, infer.gpu_milli, infer.cpu_milli, infer.memory_mib) == (1, 250, 500, 2048)
    assert (infer.duration, infer.deleted_at, infer.gpu_names) == (None, 900.0, ("t4", "a10g"))


@pytest.mark.parametrize(("row", "message"), [
    ("p,0,10,1.5,1,1Gi", "a fraction must be below 1"),
    ("p,0,,1,1,1Gi", "give a duration"),
    ("p,x,10,1,1,1Gi", "arrival 'x' is not a number"),
    ("p,0,10,1,1,lots", "memory"),
])
def test_bad_rows_are_named(tmp_path: Path, row: str, message: str) -> None:
    path = tmp_path / "bad.csv"
    path.write_text("name,arrival,duration,gpus,cpu,memory\n" + row + "\n")
    with pytest.raises(TraceError, match=message) as caught:
        read_trace(path, "csv")
    assert "bad.csv:2" in str(caught.value)


def test_missing_columns_and_files_are_named(tmp_path: Path) -> None:
    path = tmp_path / "short.csv"
    path.write_text("name,cpu_milli\nx,1\n")
    with pytest.raises(TraceError, match="missing column"):
        read_trace(path)
    with pytest.raises(TraceError, match="no such file"):
        read_trace(tmp_path / "absent.csv")
