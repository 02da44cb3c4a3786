"""The options table (runtime/options.py) against `Engine`'s signature, the server's, the
cluster's and the ranks' flags, and the docs page."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

from runtime import Engine, options
from runtime.cluster.__main__ import config_from_args
from runtime.cluster.__main__ import parse_args as cluster_args
from runtime.errors import UnknownOptionError
from runtime.server.__main__ import build_parser, engine_kwargs, parse_args
from runtime.workers import launch

REPO = Path(__file__).resolve().parents[2]


def _engine_parameters() -> dict[str, inspect.Parameter]:
    params = inspect.signature(Engine.__init__).parameters
    return {n: p for n, p in params.items() if n != "self" and p.kind != p.VAR_KEYWORD}


def _actions(parser: argparse.ArgumentParser) -> dict[str, argparse.Action]:
    return {a.dest: a for a in parser._actions if a.option_strings and a.dest != "help"}


def test_engine_signature_is_the_table():
    params = _engine_parameters()
    assert set(params) == {o.name for o in options.ENGINE_OPTIONS}
    for opt in options.ENGINE_OPTIONS:
        assert params[opt.name].default == opt.default, opt.name


def test_the_server_flags_are_generated_from_the_table():
    actions = _actions(build_parser())
    chat = {"chat_template", "tool_call_parser", "reasoning_parser"}  # the server's own group
    flagged = [o for o in options.OPTIONS if o.flag]
    assert set(actions) == {o.attr for o in flagged} | chat
    for opt in flagged:
        action = actions[opt.attr]
        negated = tuple(f"--no-{f[2:]}" for f in opt.flag_names if opt.action == "optional_bool")
        assert tuple(action.option_strings) == opt.flag_names + negated, opt.name
        assert action.default == opt.parser_default, opt.name
        assert action.help == opt.help, opt.name
        assert action.choices == opt.choices or tuple(action.choices or ()) == opt.choices


def test_every_engine_keyword_has_a_flag_or_takes_a_flags_value():
    actions = _actions(build_parser())
    for opt in options.ENGINE_OPTIONS:
        assert opt.flag or opt.source in actions, opt.name
    assert options.option("disaggregation_bootstrap_host").source == "host"


def test_parsed_defaults_are_the_engines_but_where_the_table_says():
    got = engine_kwargs(parse_args([]))
    params = _engine_parameters()
    assert set(got) == set(params) - {"model"}
    differ = {name for name, value in got.items() if value != params[name].default}
    # the prefill bootstrap: port 8998 and the server's --host, as the table says
    assert differ == {"disaggregation_bootstrap_port", "disaggregation_bootstrap_host"}
    assert got["disaggregation_bootstrap_port"] == 8998
    assert got["disaggregation_bootstrap_host"] == "127.0.0.1"


def test_flags_map_to_keywords():
    kw = engine_kwargs(parse_args([
        "--tp-size", "2", "--disable-radix-cache", "--grammar-compile-timeout", "3",
        "--host", "0.0.0.0", "--speculative-algorithm", "ngram", "--cuda-graph-bs", "1", "4",
        "--no-overlap-schedule", "--kv-calibration", "none",
    ]))  # fmt: skip
    assert kw["tp_size"] == 2 and kw["enable_radix_cache"] is False
    assert kw["grammar_compile_timeout_s"] == 3.0
    assert kw["disaggregation_bootstrap_host"] == "0.0.0.0"
    assert kw["speculative_algorithm"] == "NGRAM" and kw["cuda_graph_bs"] == [1, 4]
    assert kw["overlap_schedule"] is False and kw["kv_calibration"] == "none"
    with pytest.raises(SystemExit):
        parse_args(["--kv-calibration", "exact"])


def test_help_lists_every_group():
    text = build_parser().format_help()
    for title in options.GROUPS.values():
        assert title in text
    assert "chat: templates, tool calls, reasoning" in text


def test_an_unknown_engine_keyword_is_named():
    with pytest.raises(UnknownOptionError, match="'pagesize'.*page_size") as info:
        Engine(pagesize=4)  # before anything loads
    assert info.value.name == "pagesize" and isinstance(info.value, TypeError)
    with pytest.raises(UnknownOptionError, match="'host'"):
        Engine(host="0.0.0.0")  # a server-only flag is not an Engine keyword


def test_cluster_flags_come_from_the_table_and_pass_on_what_differs():
    cluster = cluster_args(["--tp", "2", "--device", "cpu", "--model", "m"])
    assert (cluster.tp_size, cluster.pp_size, cluster.device, cluster.model) == (2, 1, "cpu", "m")
    config = config_from_args(cluster)
    assert config.server_args == ["--tp=2", "--device=cpu"] and config.model == "m"
    assert cluster_args([]).device is None  # the server's own default
    assert config_from_args(cluster_args([])).server_args == []
    pd = config_from_args(cluster_args(["--prefill", "1", "--decode", "1"])).server_args
    assert pd == ["--disaggregation-transfer-backend", "tcp"]


def test_launch_flags_come_from_the_table():
    parser = launch.build_parser()
    assert {"tp_size", "pp_size", "ep_size", "nnodes", "node_rank", "dist_init_addr"} <= set(
        _actions(parser)
    )
    with pytest.raises(SystemExit):
        parser.parse_args(["--tp", "2"])  # --nnodes, --node-rank, --dist-init-addr required
    a = parser.parse_args(["--model", "m", "--pp-size", "2", "--nnodes", "2", "--node-rank", "1",
                           "--dist-init-addr", "h:1"])  # fmt: skip
    assert (a.tp_size, a.pp_size, a.nnodes, a.node_rank, a.dist_init_addr) == (1, 2, 2, 1, "h:1")


def test_the_docs_page_is_the_table():
    text = (REPO / "docs" / "options.md").read_text()
    assert text == options.doc_with_table(text), (
        "docs/options.md differs from runtime/options.py: "
        "python -c \"import runtime.options as o; o.update_doc('docs/options.md')\""
    )
    for opt in options.ENGINE_OPTIONS:
        assert f"`{opt.name}`" in text
