"""SkyPilot task generation and launch, AWS and GCP providers (S3 store, spot prices, preemption
notices), price tables and cost accounting. Nothing is implemented here yet."""
