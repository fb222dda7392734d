"""ray-tpu: Ray on Google Cloud TPU slices, from the GKE cluster to the model."""
