"""The paper's findings as verdicts: a statistic, its interval, a threshold, a decision, each criterion checked
on controls with a known answer."""
