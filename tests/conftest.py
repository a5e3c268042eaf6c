import os

import pytest
import torch
from hypothesis import HealthCheck, settings

import fa2  # noqa: F401  (registers the ops)

# Hypothesis profiles: "ci" keeps the 2-core CI run short; "dev" is the default; "gpu" for the H200 runs.
_common = dict(deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
               derandomize=False)
settings.register_profile("ci", max_examples=25, **_common)
settings.register_profile("dev", max_examples=60, **_common)
settings.register_profile("gpu", max_examples=150, **_common)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "dev"))


def pytest_collection_modifyitems(config, items):
    if os.environ.get("FA2_CI") == "1":
        skip = pytest.mark.skip(reason="slow test: skipped under the CI profile (FA2_CI=1)")
        for item in items:
            if "slow" in item.keywords:
                item.add_marker(skip)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)
