"""How completions are drawn: the sampling settings, checkable sampling's seeded race, top-k/top-p edges, the sampler role."""
