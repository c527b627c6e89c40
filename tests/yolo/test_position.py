"""Per-sample seeds: what a sample's augmentation draws is a function of (seed, epoch, index) alone."""

from __future__ import annotations

import random

import numpy as np
import torch

from trainbox.yolo import position


def _draws() -> tuple:
    return random.random(), float(np.random.rand()), torch.rand(3).tolist()


def test_seeding_a_sample_draws_what_torch_manual_seed_would() -> None:
    """The cheaper seeding (torch's CPU generator only) leaves every generator a sample draws from as before."""
    seed = position._mix(7, 2, 41)
    position._seed_all(seed)
    cheap = _draws()
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)
    assert cheap == _draws()


def test_a_sample_loaded_in_the_training_process_leaves_its_generators_alone() -> None:
    class Draws:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> tuple:
            return _draws()

    samples = position.SeededSamples(Draws(), seed=3)
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    expected = _draws()
    torch.manual_seed(11)
    random.seed(11)
    np.random.seed(11)
    first = samples[position.TaggedIndex(2, epoch=1, batch=1)]
    assert _draws() == expected  # the reseeding for the sample was undone
    assert samples[position.TaggedIndex(2, epoch=1, batch=1)] == first  # the same sample, the same draws
    assert samples[position.TaggedIndex(2, epoch=2, batch=1)] != first  # another epoch, other draws
