"""vitlab benchmarks: attention-capture coverage over timm's ViT family and capture speed.

Run everything with ``python -m benchmarks`` (or ``python benchmarks/run.py``); see ``BENCHMARKS.md``.
"""
