"""When each request is sent: a gamma process (vLLM's --request-rate and --burstiness) or all at once."""

from __future__ import annotations

import math

import numpy as np

from rooftop.errors import InvalidRequestError


def arrival_offsets(n: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Send times in seconds from the start, the first at 0. Gaps are gamma(shape=burstiness,
    scale=1/(rate*burstiness)): mean 1/rate whatever the burstiness; burstiness 1 is a Poisson process,
    below 1 burstier, above 1 more regular. An infinite rate sends everything at once.
    Times are planned up front so that slow sends never stretch the schedule."""
    if not rate > 0:
        raise InvalidRequestError(f"--request-rate must be > 0 or inf, got {rate}")
    if not 0 < burstiness < math.inf:
        raise InvalidRequestError(f"--burstiness must be > 0, got {burstiness}")
    if math.isinf(rate):
        return [0.0] * n
    gaps = np.random.default_rng(seed).gamma(shape=burstiness, scale=1 / (rate * burstiness), size=max(n - 1, 0))
    return [0.0, *np.cumsum(gaps).tolist()][:n]
