"""Training: optimiser families, privacy accounting, pruning and the training loop (:mod:`.loop`)."""
