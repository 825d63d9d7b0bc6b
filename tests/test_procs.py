"""gpufleet.procs: a child started with child_env() stops when its parent dies, even by SIGKILL,
which no signal handler of the parent can forward (the demo's dashboard and report children); a
service stops on a SIGTERM whichever thread it lands on; gc_paused leaves the collector as it was."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap


from gpufleet.procs import PARENT_PID_ENV, exit_with_parent
from tests.realstack.process import free_port, wait_for
from tests.support.dashboard import dashboard_healthy


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"  # a zombie has exited already
    except FileNotFoundError:
        return False


def test_dashboard_and_its_streamlit_stop_when_the_parent_is_killed(tmp_path):
    port = free_port()
    cfg = tmp_path / "gpufleet.toml"
    cfg.write_text(f'[collector]\nstore = "{tmp_path / "store"}"\n')
    parent = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import subprocess, sys, time
        from gpufleet.procs import child_env
        child = subprocess.Popen([sys.executable, "-m", "gpufleet.cli", "dashboard", "--config", {str(cfg)!r},
                                  "--listen", "127.0.0.1:{port}"], start_new_session=True, env=child_env(),
                                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        print(child.pid, flush=True)
        time.sleep(600)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        dashboard = int(parent.stdout.readline())
        wait_for("the dashboard", lambda: dashboard_healthy(port), timeout=90)
        streamlit = [int(p) for p in subprocess.run(["pgrep", "-P", str(dashboard)], capture_output=True, text=True).stdout.split()]
        assert len(streamlit) == 1 and alive(streamlit[0])
        parent.kill()  # SIGKILL: nothing in the parent runs any more
        parent.wait()
        wait_for("the dashboard and its streamlit to stop", lambda: not alive(dashboard) and not alive(streamlit[0]), timeout=30)
    finally:
        if parent.poll() is None:
            parent.kill()
        subprocess.run(["pkill", "-f", str(cfg)], check=False)


def test_a_process_not_started_by_child_env_is_left_alone(monkeypatch):
    monkeypatch.delenv(PARENT_PID_ENV, raising=False)
    assert exit_with_parent() is False


def test_a_child_whose_parent_is_already_gone_stops_at_once(tmp_path):
    """The parent can die between fork and prctl: the child then sees another parent pid."""
    env = {**os.environ, PARENT_PID_ENV: "1"}  # pid 1 is never our parent here
    code = "from gpufleet.procs import exit_with_parent; import time; exit_with_parent(); time.sleep(30)"
    proc = subprocess.run([sys.executable, "-c", code], env=env, timeout=20)
    assert proc.returncode == -signal.SIGTERM


# A service's main thread waits for SIGTERM while other threads work; the signal lands on one of
# those (here aimed there with pthread_kill, as the kernel may deliver a process' signal to any
# thread). STOPS prints when the main thread has seen it.
SERVICE = """
import signal, sys, threading, time
from gpufleet.procs import stop_on_signals, wait_until_stopped
stop = stop_on_signals()
def worker():
    print("READY", flush=True)
    sys.stdin.readline()
    signal.pthread_kill(threading.get_ident(), signal.SIGTERM)
    time.sleep(60)
threading.Thread(target=worker, daemon=True).start()
wait_until_stopped(stop)
print("STOPS", flush=True)
"""


def test_a_service_stops_on_a_sigterm_another_thread_received():
    """The stop is acted on within the wait's poll period, not at the next signal (`gpufleet
    collect` under load ignored a SIGTERM until its test's second one came)."""
    proc = subprocess.Popen([sys.executable, "-c", SERVICE], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "READY"
        out, _ = proc.communicate("go\n", timeout=30)  # (an untimed wait: never, the worker sleeps on)
        assert (out.strip(), proc.returncode) == ("STOPS", 0)
    finally:
        proc.kill()
        proc.wait()


def test_the_cycle_collector_is_paused_in_the_block_and_back_as_it_was_after():
    import gc

    from gpufleet.procs import gc_paused

    assert gc.isenabled()
    with gc_paused():
        assert not gc.isenabled()
        with gc_paused():  # (nested: the inner block found it off, and leaves it off)
            assert not gc.isenabled()
        assert not gc.isenabled()
    assert gc.isenabled()
    try:
        with gc_paused():
            raise RuntimeError("in the block")
    except RuntimeError:
        pass
    assert gc.isenabled()
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()  # (off before: left off)
    finally:
        gc.enable()
