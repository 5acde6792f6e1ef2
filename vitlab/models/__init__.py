"""Models: their configs, the zoo, checkpoints, loading any model spec (``load.load_model``) and ``ModelInfo``."""
