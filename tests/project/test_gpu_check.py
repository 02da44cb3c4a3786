"""benchmarks/gpu_check.sh and gpu/check.py are run for real only on a lent GPU; here their
non-GPU parts are: the shell scripts parse, a bad flag is refused, and one comparison of
gpu/check.py (engine vs transformers, the padded decode path) runs on the CPU."""

from __future__ import annotations

import subprocess

import pytest
import torch

from benchmarks.gpu import check as gpu_check
from tests.support.paths import REPO
from tests.support.tiny_models import make_tiny_model


@pytest.mark.parametrize("script", ["gpu_check.sh", "gpu/payload.sh"])
def test_the_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / "benchmarks" / script)], check=True)


def test_a_bad_flag_is_refused():
    out = subprocess.run(["bash", str(REPO / "benchmarks/gpu_check.sh"), "--bogus"],
                         capture_output=True, text=True)  # fmt: skip
    assert out.returncode == 2 and "usage" in out.stdout


def test_one_comparison_runs_on_the_cpu(tmp_path):
    folder = make_tiny_model(tmp_path / "tiny")
    kw = {"cuda_graph_bs": [1, 2, 4]}
    row = gpu_check.compare("tiny", "tiny Llama", folder, torch.device("cpu"), 4, kw)
    assert row.ok and row.result == "equal", row
    assert "graphs True" in row.detail
