"""Spot audits: the archive of published versions, the race's margins, the flip test, refusals, and the Auditor."""
