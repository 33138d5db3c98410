"""`ddp-orch compare` refusals from the command line: exit 2 before anything runs."""

from __future__ import annotations

from conftest import run_cli


def test_compare_baseline_dp_on_cpu_processes_exits_2_before_running(tmp_path):
    proc = run_cli("compare", "--local", "--workload", "mlp", "--procs", "2", "--baseline", "dp",
                   "--runs-dir", str(tmp_path / "runs"), timeout=60)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "--baseline dp: nn.DataParallel needs at least 2 GPUs on node 0" in proc.stderr
    assert "Traceback" not in proc.stderr and not (tmp_path / "runs").exists()
