"""Computed training parameters as the snippet a user pastes: Lightning, transformers or YAML."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..exceptions import ConfigError

__all__ = ["EMIT_FORMATS", "emit_snippet"]

EMIT_FORMATS = ("lightning", "transformers", "yaml")
_LIGHTNING_PRECISION = {"fp32": "32-true", "bf16": "bf16-mixed", "fp16": "16-mixed"}


def _values(recs: Iterable[Any]) -> dict[str, Any]:
    return {r.name: r.value for r in recs if r.value is not None}


def _lit(v: Any) -> str:
    return f"{v:.3g}" if isinstance(v, float) else repr(v)


def emit_snippet(recs: Iterable[Any], fmt: str, *, header: str = "") -> str:  # noqa: C901
    """``recs`` (Recommendations) as Python or YAML to paste: ``fmt`` is one of :data:`EMIT_FORMATS`.

    Only parameters that were computed appear; a value the measurements did not allow is left
    out, with a comment saying so.
    """
    if fmt not in EMIT_FORMATS:
        raise ConfigError(f"fmt={fmt!r} is unknown; valid: {', '.join(EMIT_FORMATS)}.")
    recs = list(recs)
    v = _values(recs)
    missing = sorted({"batch_size", "lr", "grad_accumulation", "precision"} - set(v))
    lines = [f"# {header}"] if header else []
    if missing:
        lines.append(f"# not computed from the measurements: {', '.join(missing)}")
    loading = v.get("data_loading") if isinstance(v.get("data_loading"), dict) else {}
    if fmt == "yaml":
        import yaml

        keys = ("batch_size", "lr", "grad_accumulation", "precision", "critical_batch_size")
        body = {k: v[k] for k in keys if k in v}
        if loading:
            body["data_loading"] = loading
        return "\n".join([*lines, yaml.safe_dump(body, sort_keys=False).rstrip()]) + "\n"
    if fmt == "lightning":
        args = []
        if "grad_accumulation" in v:
            args.append(f"accumulate_grad_batches={int(v['grad_accumulation'])}")
        if "precision" in v:
            args.append(f'precision="{_LIGHTNING_PRECISION.get(str(v["precision"]), v["precision"])}"')
        lines.append(f"trainer = L.Trainer({', '.join(args)})")
        attrs = [f"batch_size={int(v['batch_size'])}"] if "batch_size" in v else []
        if "lr" in v:
            attrs.append(f"lr={_lit(float(v['lr']))}")
        if attrs:
            lines.append(f"# on the LightningModule/DataModule, where Lightning's tuner sets them: "
                         f"{', '.join(attrs)}")
        if loading:
            lines.append("# DataLoader(" + ", ".join(f"{k}={_lit(x)}" for k, x in loading.items()) + ")")
        return "\n".join(lines) + "\n"
    args = []
    if "batch_size" in v:
        args.append(f"per_device_train_batch_size={int(v['batch_size'])}")
    if "grad_accumulation" in v:
        args.append(f"gradient_accumulation_steps={int(v['grad_accumulation'])}")
    if "lr" in v:
        args.append(f"learning_rate={_lit(float(v['lr']))}")
    precision = str(v.get("precision", "fp32"))
    if precision in ("bf16", "fp16"):
        args.append(f"{precision}=True")
    if loading:
        args.append(f"dataloader_num_workers={int(loading.get('num_workers', 0))}")
        args.append(f"dataloader_pin_memory={bool(loading.get('pin_memory', False))}")
    lines.append(f"args = TrainingArguments(output_dir=\"out\", {', '.join(args)})")
    return "\n".join(lines) + "\n"
