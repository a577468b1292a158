"""Both trainer callbacks in a real Trainer for a few steps, each leaving a profile Run."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch

from proftune.track import Store


def test_lightning_callback_leaves_a_profile_run(tmp_path: Path) -> None:
    L = pytest.importorskip("lightning")
    from proftune.integrations import resolve_object
    from proftune.integrations.lightning import ProftuneCallback

    lit = Path(__file__).parent / "lit_digits.py"
    LitModel = resolve_object(f"{lit}:LitModel", what="task")
    DigitsData = resolve_object(f"{lit}:DigitsData", what="data")

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    cb = ProftuneCallback(every=3, db=db)
    logger = L.pytorch.loggers.CSVLogger(str(tmp_path / "logs"))
    trainer = L.Trainer(max_epochs=1, limit_train_batches=10, limit_val_batches=2, callbacks=[cb],
                        logger=logger, enable_checkpointing=False, enable_progress_bar=False,
                        enable_model_summary=False, accelerator="cpu", val_check_interval=4)
    torch.manual_seed(0)
    trainer.fit(LitModel(), datamodule=DigitsData(batch_size=32))
    assert cb.run_id is not None
    run = Store(db).get_run(cb.run_id)
    assert run.kind == "profile"
    assert run.status == "finished"
    assert run.task == "LitModel"
    assert run.metrics["params"] == 64 * 64 + 64 + 64 * 10 + 10
    assert run.metrics["macs"] == 32 * (64 * 64 + 64 * 10)  # the sampled batch of 32
    assert run.result["config"]["steps_seen"] == 10
    assert cb.monitor.samples == 3  # steps 3, 6, 9; the validation runs in between were not seen
    assert run.result["layers"]
    assert "findings" in run.result
    logged = (Path(logger.log_dir) / "metrics.csv").read_text()
    assert "proftune/step_time_ms" in logged


def test_transformers_callback_leaves_a_profile_run(tmp_path: Path) -> None:
    transformers = pytest.importorskip("transformers")
    from proftune.integrations.transformers import ProftuneCallback

    cfg = transformers.BertConfig(num_hidden_layers=1, hidden_size=32, num_attention_heads=2,
                                  intermediate_size=64, vocab_size=100, num_labels=2)
    torch.manual_seed(0)
    model = transformers.BertForSequenceClassification(cfg)
    g = torch.Generator().manual_seed(0)
    rows = [{"input_ids": torch.randint(0, 100, (8,), generator=g), "attention_mask": torch.ones(8, dtype=torch.long),
             "labels": torch.tensor(i % 2)} for i in range(64)]

    class Rows(torch.utils.data.Dataset[Any]):
        def __len__(self) -> int:
            return len(rows)

        def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
            return rows[i]

    db = f"sqlite:///{tmp_path / 'runs.db'}"
    cb = ProftuneCallback(every=2, db=db)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), max_steps=6, per_device_train_batch_size=8,
                                          eval_strategy="steps", eval_steps=3, per_device_eval_batch_size=8,
                                          report_to=[], save_strategy="no", use_cpu=True, logging_steps=100,
                                          disable_tqdm=True)
    trainer = transformers.Trainer(model=model, args=args, train_dataset=Rows(), eval_dataset=Rows(), callbacks=[cb])
    trainer.train()
    assert cb.run_id is not None
    run = Store(db).get_run(cb.run_id)
    assert run.kind == "profile"
    assert run.status == "finished"
    assert run.task == "BertForSequenceClassification"
    assert run.metrics["params"] == sum(p.numel() for p in model.parameters())
    assert run.metrics["macs"] > 0
    assert run.result["batch_size"] == 8
    assert cb.monitor.samples == 3
