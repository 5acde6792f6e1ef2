"""Probing frozen features: the paper's few-shot linear probe (section 4.1) and a full logistic probe."""
