"""The scheduler is the one owner of its state: no other scheduling module touches its queues
or counters; every model kind satisfies the `Model` protocol the scheduler calls; a plain
engine never routes a request through the disaggregation module; an imported request is
admitted through the same path as any other."""

from __future__ import annotations

import ast

import pytest
import torch

from tests.support.paths import REPO

SCHEDULER_STATE = {"waiting", "running", "counters", "_admit_clock"}


def test_only_the_scheduler_changes_its_queues_and_counters():
    wrong = []
    for path in sorted((REPO / "runtime" / "scheduling").glob("*.py")):
        if path.name == "scheduler.py":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Attribute) and node.attr in SCHEDULER_STATE:
                wrong.append(f"{path.name}:{node.lineno} .{node.attr}")
    assert wrong == []


def test_every_model_kind_is_a_model(tmp_path):
    from runtime.models.loader import load_model_files
    from runtime.models.model import Model
    from runtime.models.registry import model_class
    from runtime.workers.driver import ParallelModel
    from tests.support.tiny_models import make_tiny_model

    for kind in ("llama", "deepseek_v2"):
        loaded = load_model_files(make_tiny_model(tmp_path / kind, kind))
        model = model_class(loaded.config)(loaded.config, loaded.state_dict, torch.float32)
        assert isinstance(model, Model), kind
    # the parallel driver is built only with worker processes: its class carries the methods
    assert all(callable(getattr(ParallelModel, name, None)) for name in ("forward", "weight_bytes"))
    assert "config" in ParallelModel.__init__.__code__.co_names


def test_a_plain_engine_never_consults_the_disaggregation_module(tmp_path, monkeypatch):
    import runtime.engine as engine_module
    from runtime import Engine
    from tests.support.tiny_models import make_tiny_model

    def refuse(*args, **kwargs):
        raise AssertionError("a plain request went through disaggregation")

    monkeypatch.setattr(engine_module, "split_bootstrap", refuse)
    monkeypatch.setattr(engine_module, "finish_room", refuse)
    with Engine(str(make_tiny_model(tmp_path / "m")), max_total_tokens=512) as engine:
        monkeypatch.setattr(engine.disaggregation, "attach_prefill", refuse)
        monkeypatch.setattr(engine.disaggregation, "submit_decode", refuse)
        plain = engine.generate("Hello", max_new_tokens=3, temperature=0.0)
        # a room on a plain server is served as a plain request
        roomed = engine.generate("Hello", max_new_tokens=3, temperature=0.0, bootstrap_room=7)
        stream = list(engine.generate("Hello", max_new_tokens=3, temperature=0.0, stream=True))
    assert roomed.token_ids == plain.token_ids
    assert [t for c in stream for t in c.token_ids] == plain.token_ids


def test_imported_and_plain_admissions_share_one_path():
    tree = ast.parse((REPO / "runtime" / "scheduling" / "scheduler.py").read_text())
    calls: dict[str, set[str]] = {}  # function -> attribute calls in it, as "x.y" text
    for fn in ast.walk(tree):
        if isinstance(fn, ast.FunctionDef):
            calls[fn.name] = {
                ast.unparse(n.func)
                for n in ast.walk(fn)
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
            }
    assert "self._admit_request" in calls["_admit"]
    assert "self._admit_request" in calls["_admit_imported"]
    # only the one path moves a request into `running`: admission, or (a Mooncake transfer's
    # request, admitted by that same path into `landing`) once its pages have landed
    assert [name for name, c in calls.items() if "self.running.append" in c] == ["_enter_running"]
    entering = {name for name, c in calls.items() if "self._enter_running" in c}
    assert entering == {"_admit_request", "_land"}


@pytest.mark.parametrize("name", ["step_results", "overlap", "handoff", "constrained"])
def test_phases_do_not_import_the_scheduler(name):
    src = (REPO / "runtime" / "scheduling" / f"{name}.py").read_text()
    assert "scheduling.scheduler" not in src
