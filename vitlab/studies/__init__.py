"""Studies of many training runs: the data-scaling sweep (Fig. 3/4) and the masked-patch-prediction study."""
