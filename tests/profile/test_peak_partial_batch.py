"""peak_step_memory measures a full-size batch, never an epoch's partial last batch."""

from __future__ import annotations

from proftune.profile import peak_step_memory


def test_peak_grows_past_half_the_dataset() -> None:
    # digits has 1437 training samples: at 800 the second batch of an epoch holds only 637
    below = peak_step_memory("digits-mlp", batch_size=700, device="cpu")
    above = peak_step_memory("digits-mlp", batch_size=800, device="cpu")
    assert above > below
