"""1,000 GPU pods created in the local Kubernetes API → all bound, the whole emulator running.

The chaos suite's emulator (`tests.chaos.rig`): the agent watching the API and sending pending-pods documents,
the pollers driving packer and fleet, EC2 (moto behind the strict layer) launching, simulated kubelets joining
nodes 1.5 s after launch (45 s compressed 30×, so the figure is the pipeline's own work, not a boot), the
device plugin advertising GPUs, the scheduler binding. Consolidation is held off (`consolidateAfter` 1 h) so
nothing moves pods while they arrive, and the pools' limits are lifted (the example's 256 GPUs would leave
744 pods unschedulable, with a reason). Printed: seconds to the first, half, 90 % and all pods bound, and what
it took (documents, packer batches, instances).
"""

from __future__ import annotations

import contextlib
import os
import time
from dataclasses import dataclass, field

from benchmarks.load import unlimited
from benchmarks.load.sampler import Sampler
from tests.chaos.rig import SOAK_VISIBILITY, chaos_config, gpu_pod, running_rig

__all__ = ["BoundRun", "run"]


@dataclass
class BoundRun:
    pods: int
    created_seconds: float = 0.0
    marks: dict[str, float] = field(default_factory=dict)
    """`first`, `50 %`, `90 %`, `all` → seconds from the first create."""
    bound: int = 0
    instances: int = 0
    documents: int = 0
    packer_batches: int = 0
    packer_seconds: float = 0.0
    fleet_invocations: int = 0
    dead_letters: int = 0
    profile: str = ""
    loads: list[float] = field(default_factory=list)
    """The 1-minute load average, once a second while waiting."""
    cpu_seconds: float = 0.0
    """This process's CPU time from the first create to the end (the whole emulator runs in it): the figure other
    processes' load on a shared machine does not inflate."""

    @property
    def ok(self) -> bool:
        return self.bound == self.pods and not self.dead_letters

    def summary(self) -> str:
        marks = ", ".join(f"{name} {seconds:.1f} s" for name, seconds in self.marks.items())
        load = f"; load average {min(self.loads):.1f}–{max(self.loads):.1f} while waiting" if self.loads else ""
        return (f"{self.bound}/{self.pods} bound ({marks}); created in {self.created_seconds:.1f} s; "
                f"CPU {self.cpu_seconds:.0f} s (this process); "
                f"{self.documents} documents, {self.packer_batches} packer batches ({self.packer_seconds:.1f} s "
                f"in the packer), {self.fleet_invocations} fleet invocations, {self.instances} instances, "
                f"{self.dead_letters} dead letters{load}")


def run(pods: int = 1000, timeout: float = 900.0, *, profile: bool = False) -> BoundRun:
    """`profile`: sample every thread's stack while the pods are placed (`benchmarks.load.sampler`); the report
    goes in `BoundRun.profile`."""
    result = BoundRun(pods)
    # The pending-pods and launch queues at the soak's visibility: a packer batch of ten documents of hundreds of
    # pods took minutes on a loaded machine (2026-11-24: 4 batches, 1,984 s), and the rig's 10 s hands the same
    # documents out again while they are packed (counting towards the dead-letter queue, deletes refused).
    with running_rig(unlimited(chaos_config(consolidate_after="1h")), soak_visibility=SOAK_VISIBILITY) as rig, \
            (Sampler() if profile else contextlib.nullcontext()) as sampler:
        began, cpu = time.monotonic(), time.process_time()
        rig.create_pods([gpu_pod(f"load-{i}") for i in range(pods)])
        result.created_seconds = time.monotonic() - began
        thresholds = {"first": 1, "50 %": pods // 2, "90 %": pods * 9 // 10, "all": pods}
        while time.monotonic() - began < timeout:
            bound = sum(1 for p in rig.pods() if p.spec.node_name)
            for name, needed in thresholds.items():
                if bound >= needed and name not in result.marks:
                    result.marks[name] = time.monotonic() - began
            result.bound = bound
            result.loads.append(os.getloadavg()[0])
            if bound == pods:
                break
            time.sleep(1.0)
        result.cpu_seconds = time.process_time() - cpu
        invocations = rig.pipeline.host.history
        packer = [i for i in invocations if i.function == "packer"]
        result.packer_batches = len(packer)
        result.documents = sum(i.records for i in packer)
        result.packer_seconds = sum(i.duration_ms for i in packer) / 1000
        result.fleet_invocations = sum(1 for i in invocations if i.function == "fleet")
        result.instances = len(rig.instances("pending", "running"))
        result.dead_letters = len(rig.pipeline.dead_letters())
    if sampler is not None:
        result.profile = sampler.report()
    return result
