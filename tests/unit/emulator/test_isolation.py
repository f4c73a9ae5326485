"""Per-thread variables and stdout: two Lambda environments in one process do not see each other's."""

from __future__ import annotations

import io
import os
import sys
import threading

from gpu_autoscaler.emulator.isolation import scope


def test_a_scope_sees_its_variables_over_the_process_and_leaves_them_behind() -> None:
    os.environ["GPU_AUTOSCALER_TEST_SHARED"] = "process"
    try:
        with scope({"GPU_AUTOSCALER_TEST_OWN": "packer", "GPU_AUTOSCALER_TEST_SHARED": "packer"}, io.StringIO()):
            assert os.environ["GPU_AUTOSCALER_TEST_OWN"] == "packer"
            assert os.getenv("GPU_AUTOSCALER_TEST_SHARED") == "packer"
            assert "GPU_AUTOSCALER_TEST_OWN" in dict(os.environ)
            del os.environ["GPU_AUTOSCALER_TEST_SHARED"]
            assert "GPU_AUTOSCALER_TEST_SHARED" not in os.environ
        assert "GPU_AUTOSCALER_TEST_OWN" not in os.environ
        assert os.environ["GPU_AUTOSCALER_TEST_SHARED"] == "process"
    finally:
        del os.environ["GPU_AUTOSCALER_TEST_SHARED"]


def test_concurrent_scopes_see_only_their_own_variables_and_output() -> None:
    seen: dict[str, str | None] = {}
    streams = {name: io.StringIO() for name in ("fleet", "drain")}
    inside = threading.Barrier(2)

    def run(name: str) -> None:
        with scope({"GPU_AUTOSCALER_TEST_FUNCTION": name}, streams[name]):
            inside.wait(timeout=5)  # both scopes are open at once
            seen[name] = os.environ.get("GPU_AUTOSCALER_TEST_FUNCTION")
            print(f"hello from {name}")
            inside.wait(timeout=5)

    threads = [threading.Thread(target=run, args=(name,)) for name in streams]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=10)
    assert seen == {"fleet": "fleet", "drain": "drain"}
    assert streams["fleet"].getvalue() == "hello from fleet\n"
    assert streams["drain"].getvalue() == "hello from drain\n"
    assert "GPU_AUTOSCALER_TEST_FUNCTION" not in os.environ
    assert sys.stdout.write("") == 0  # outside a scope, stdout is what it was
