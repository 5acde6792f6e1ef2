"""Training: ``TrainConfig``, the loop, distillation, masked patch prediction, run records, per-epoch Fig. 7
statistics and shipping a run."""
