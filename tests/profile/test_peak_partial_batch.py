"""peak_step_memory measures a full-size batch, never an epoch's partial last batch."""

from __future__ import annotations

from proftune.profile import peak_step_memory


def test_peak_grows_past_half_the_dataset() -> None:
    # digits has 1437 training samples: at 800 the second batch of an epoch holds only 637
    below = peak_step_memory("digits-mlp", batch_size=700, device="cpu")
    above = peak_step_memory("digits-mlp", batch_size=800, device="cpu")
    assert above > below


def test_a_profile_never_measures_an_epochs_partial_last_batch() -> None:
    """digits has 1437 training samples: at batch 256 the sixth batch holds 157, and steps=2 put
    the memory step there (7.6 MiB measured against 12.1 MiB for a full batch of digits-cnn)."""
    import proftune

    p = proftune.profile("digits-cnn", batch_size=256, steps=2, device="cpu")
    full = peak_step_memory("digits-cnn", batch_size=256, device="cpu")
    assert abs(p.memory.peak_bytes / full - 1) < 0.02
    assert p.batch_size == 256
    assert p.memory.activations_bytes == proftune.predict("digits-cnn", batch_size=256, target=None,
                                                          max_batch=False).memory.activations_bytes
