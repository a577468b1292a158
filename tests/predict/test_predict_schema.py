"""One schema for the step, measured or predicted: ``profile --json`` and ``predict --json`` of one
task and batch name and nest every concept they share the same way, and the prediction is a
versioned record that survives its own JSON."""

from __future__ import annotations

import json
from typing import Any

import pytest
from typer.testing import CliRunner

from proftune.cli import app
from proftune.exceptions import ConfigError
from proftune.predict import PREDICT_SCHEMA_VERSION, PredictConfig, PredictResult, predict
from proftune.track import Store

runner = CliRunner()

#: The concepts a measurement and a prediction of one training step both have, by path.
SHARED = ("task", "device", "batch_size", "mode", "schema_version", "params.total", "params.trainable",
          "flops", "backward_flops", "memory.params_bytes", "memory.grads_bytes", "memory.optimizer_bytes",
          "memory.activations_bytes", "memory.peak_bytes", "step.time_ms", "step.forward_ms",
          "step.backward_ms", "step.optimizer_ms", "layers", "uncounted_ops", "config.params")
SHARED_LAYER = ("name", "type", "params", "flops", "forward_ms", "backward_ms", "activation_bytes")
#: Exactly the same number whether counted on the real step or traced on the fake one.
EXACT = ("params.total", "params.trainable", "flops", "backward_flops", "memory.params_bytes",
         "memory.grads_bytes", "memory.optimizer_bytes", "memory.activations_bytes", "batch_size", "task", "mode")


def _at(d: dict[str, Any], path: str) -> Any:
    for key in path.split("."):
        assert isinstance(d, dict), path
        assert key in d, f"{path}: no {key!r} in {sorted(d)}"
        d = d[key]
    return d


def _json(args: list[str]) -> dict[str, Any]:
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    return dict(json.loads(out.stdout))


@pytest.fixture(scope="module")
def both() -> tuple[dict[str, Any], dict[str, Any]]:
    measured = _json(["profile", "digits-cnn", "--batch-size", "32", "--steps", "2", "--device", "cpu", "--json"])
    predicted = _json(["predict", "digits-cnn", "--batch-size", "32", "--target", "cpu", "--device", "cpu",
                       "--json"])
    return measured, predicted


def test_shared_concepts_have_the_same_paths_and_types(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    measured, predicted = both
    for path in SHARED:
        a, b = _at(measured, path), _at(predicted, path)
        number = (int, float)
        assert (isinstance(a, number) and isinstance(b, number)) or type(a) is type(b), (path, a, b)
    for key in EXACT:
        assert _at(measured, key) == _at(predicted, key), key
    assert abs(predicted["memory"]["peak_bytes"] / measured["memory"]["peak_bytes"] - 1) < 0.05
    assert predicted["config"]["params"]["batch_size"] == measured["config"]["params"]["batch_size"] == 32


def test_layers_compare_row_by_row(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    measured, predicted = both
    rows = {lay["name"]: lay for lay in predicted["layers"]}
    assert len(measured["layers"]) == 16
    for lay in measured["layers"]:
        twin = rows[lay["name"]]
        assert set(SHARED_LAYER) <= set(lay) & set(twin)
        for key in ("type", "params", "flops", "activation_bytes"):
            assert lay[key] == twin[key], (lay["name"], key)


def test_what_only_a_prediction_has_is_in_its_own_keys(both: tuple[dict[str, Any], dict[str, Any]]) -> None:
    measured, predicted = both
    for key in ("target", "bound", "peak", "max_batch_size", "fits"):
        assert key in predicted
        assert key not in measured
    assert predicted["peak"]["phase"] in ("forward", "backward", "optimizer")
    assert sum(predicted["peak"]["breakdown"].values()) == predicted["memory"]["peak_bytes"]
    # the flat spellings of before are gone: one name per concept
    for old in ("peak_bytes", "params_bytes", "step_time_ms", "phase_ms", "peak_phase", "static_bytes"):
        assert old not in predicted


def test_the_record_round_trips_through_its_json() -> None:
    r = predict("digits-mlp", batch_size=16, target="h100", device="cpu")
    assert r.schema_version == PREDICT_SCHEMA_VERSION
    again = PredictResult.from_dict(json.loads(json.dumps(r.to_dict())))
    assert again.to_dict() == r.to_dict()
    assert again.memory == r.memory
    assert again.layers == r.layers
    assert again.peak == r.peak
    with pytest.raises(ConfigError, match="schema_version"):
        PredictResult.from_dict({**r.to_dict(), "schema_version": PREDICT_SCHEMA_VERSION + 1})
    with pytest.raises(ConfigError, match="not a proftune prediction"):
        PredictResult.from_dict({"peak_bytes": 1})  # the flat JSON of before


def test_predict_records_a_run_whose_result_is_the_record(db_url: str) -> None:
    r = predict("digits-mlp", batch_size=16, target="h100", device="cpu", store=db_url)
    assert r.run_id is not None
    run = Store(db_url).get_run(r.run_id)
    assert run.kind == "predict"
    assert run.status == "finished"
    assert run.metrics["predicted_peak_bytes"] == r.memory.peak_bytes
    assert PredictResult.from_dict(dict(run.result or {})).memory == r.memory
    # db= is the older spelling of the same store; both at once is an error
    r2 = predict("digits-mlp", batch_size=16, target="h100", device="cpu", db=db_url)
    assert r2.run_id == r.run_id + 1
    with pytest.raises(ConfigError, match="once"):
        predict("digits-mlp", batch_size=16, target="h100", store=db_url, db=db_url)


def test_predict_cli_takes_device_db_and_report(tmp_path: Any, db_url: str) -> None:
    page = tmp_path / "predict.html"
    out = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "16", "--target", "h100", "--device", "cpu",
                              "--db", db_url, "--report", str(page), "--json"])
    assert out.exit_code == 0, out.output
    d = json.loads(out.stdout)
    run = Store(db_url).get_run(d["run_id"])
    assert run.kind == "predict"
    assert run.config["device"] == "cpu"
    html = page.read_text()
    assert "Memory (predicted)" in html
    again = runner.invoke(app, ["predict", "digits-mlp", "--batch-size", "16", "--db", db_url, "--report", str(page)])
    assert again.exit_code == 2  # an existing report is kept without --force
    assert "--force" in again.output


def test_a_config_or_its_fields_by_name_ask_the_same() -> None:
    by_name = predict("digits-mlp", batch_size=16, target="h100", precision="bf16", max_batch=False)
    cfg = PredictConfig(batch_size=16, target="h100", precision="bf16", max_batch=False)
    by_config = predict("digits-mlp", None, cfg)
    assert by_config.memory == by_name.memory
    assert by_config.step == by_name.step
    # a field given by name overrides the config's
    bigger = predict("digits-mlp", None, cfg, batch_size=32)
    assert bigger.batch_size == 32
    assert bigger.memory.activations_bytes > by_config.memory.activations_bytes
    with pytest.raises(ConfigError, match=r"unknown options \['batch'\]; valid: .*batch_size"):
        predict("digits-mlp", batch=16)
    with pytest.raises(ConfigError, match="batch_size must be a positive integer"):
        predict("digits-mlp", target="h100")  # no batch size given
