"""Every generation backend passes the shared conformance suite; here the HF backend on the tiny model."""

from __future__ import annotations

import pytest

from training.generation import HFBackend
from training.generation.conformance import CHECKS, check_backend


@pytest.mark.parametrize("check", CHECKS, ids=lambda check: check.__name__)
def test_hf_backend_conformance(tiny_backbone, tokenizer, check):
    backend = HFBackend(tiny_backbone, batch_size=4)
    check(backend, tokenizer, tiny_backbone.adapters, 1e-4)


def test_check_backend_runs_every_check(tiny_backbone, tokenizer):
    check_backend(HFBackend(tiny_backbone), tokenizer)


def test_suite_catches_a_broken_backend(tiny_backbone, tokenizer):
    class ReversedBackend:
        """Returns results in the wrong order."""

        adapters = tiny_backbone.adapters

        def __init__(self):
            self.inner = HFBackend(tiny_backbone)

        def generate(self, requests):
            return self.inner.generate(requests)[::-1]

    with pytest.raises(AssertionError, match="out of order"):
        check_backend(ReversedBackend(), tokenizer)
