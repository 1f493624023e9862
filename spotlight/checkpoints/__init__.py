"""What a checkpoint is on disk: its layout, manifest and damaged-checkpoint fallback (`checkpoint`),
the identity that decides whether a folder's checkpoints are this run's (`resume_identity`) and the
model card written beside final/ (`model_card`). The learner (`spotlight.runtime`) writes them and the
trainer (`spotlight.train`) reads them; it imports neither."""
